/*
 * Unit tests of the controller maths (src/control.c): hand-computed values,
 * a closed loop against a simulated GPU, and the shared test vectors
 * (control_vectors.csv) that scheduler_core/guard/xcuda_control.py must match too.
 *
 *   test_control VECTORS.csv          run everything, check the vectors
 *   test_control --write VECTORS.csv  re-record the vectors (on purpose only)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/control.h"

#include "check.h"

static int close_to(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return fabs(a - b) <= 1e-9 * (1.0 + fabs(b));
}

#define NEAR(a, b) CHECK(close_to((a), (b)), "%s = %.17g, expected %.17g", #a, (double)(a), (double)(b))

static void test_clock_factor(void)
{
    /* Eq. 2, below the threshold: 1 + a_L (T - C) / T. */
    NEAR(xc_clock_factor(900, 1000, 1500, 5.0, 0.5), 1.5);
    NEAR(xc_clock_factor(500, 1000, 1500, 2.0, 0.5), 2.0);
    NEAR(xc_clock_factor(0, 1000, 1500, 2.0, 0.5), 3.0);
    NEAR(xc_clock_factor(-10, 1000, 1500, 2.0, 0.5), 3.0);  /* a negative clock reads as 0 */
    /* At and above: 1 - a_H (C - T) / (C_H - T); continuous at T. */
    NEAR(xc_clock_factor(1000, 1000, 1500, 5.0, 0.5), 1.0);
    NEAR(xc_clock_factor(1250, 1000, 1500, 5.0, 0.5), 0.75);
    NEAR(xc_clock_factor(1500, 1000, 1500, 5.0, 0.5), 0.5);
    NEAR(xc_clock_factor(1800, 1000, 1500, 5.0, 0.5), 0.5);  /* above C_H: clamped */
    /* Missing clock information: no correction. */
    NEAR(xc_clock_factor(900, 0, 1500, 5.0, 0.5), 1.0);
    NEAR(xc_clock_factor(NAN, 1000, 1500, 5.0, 0.5), 1.0);
    NEAR(xc_clock_factor(1200, 1000, 1000, 5.0, 0.5), 1.0);  /* C_H = T: no high-clock bonus */
    NEAR(xc_clock_factor(1200, 1000, 900, 5.0, 0.5), 1.0);
    /* Never negative. */
    NEAR(xc_clock_factor(1500, 1000, 1500, 5.0, 3.0), 0.0);
    /* Eq. 1. */
    NEAR(xc_gpu_load(0.6, 1.5), 0.9);
    NEAR(xc_gpu_load(1.4, 1.0), 1.0);  /* U_SM clamped to [0, 1] */
    NEAR(xc_gpu_load(-0.2, 1.0), 0.0);
    CHECK(isnan(xc_gpu_load(NAN, 1.0)), "NaN U_SM stays NaN");
}

static void test_pid(void)
{
    struct xc_pid pid;
    xc_pid_init(&pid, 2.0, 10.0, 0.1);
    /* First step: no history, so only the integral term: ki * e * dt. */
    NEAR(xc_pid_delta(&pid, 0.2, 0.02), 10.0 * 0.2 * 0.02);
    /* Second: kp (e - e1) + ki e dt + kd (e - 2 e1 + e2) / dt. */
    double e = -0.1, expect = 2.0 * (-0.1 - 0.2) + 10.0 * -0.1 * 0.02 + 0.1 * (-0.1 - 0.4 + 0.2) / 0.02;
    NEAR(xc_pid_delta(&pid, e, 0.02), expect);
    /* dt <= 0: proportional part only. */
    NEAR(xc_pid_delta(&pid, 0.0, 0.0), 2.0 * 0.1);
}

static void test_pacer(void)
{
    struct xc_pacer_params p;
    xc_pacer_params_default(&p, 10.0);
    struct xc_pacer s;
    struct xc_pid pid;

    /* Room under the target on the first sample: open at once. */
    xc_pacer_reset(&s, 2000.0);
    xc_pid_init(&pid, 1.0, 10.0, 0.0);
    xc_pacer_step(&p, &s, &pid, 0.3, 0.9, 5000.0, 0.02);
    CHECK(s.mode == XC_PACER_OPEN, "low load opens the gate");
    NEAR(s.rate, 10000.0);

    /* Overload on the first sample: paced from the initial rate, never above 2x demand. */
    xc_pacer_reset(&s, 2000.0);
    xc_pid_init(&pid, 1.0, 10.0, 0.0);
    xc_pacer_step(&p, &s, &pid, 1.2, 0.9, 5000.0, 0.02);
    CHECK(s.mode == XC_PACER_CLOSED, "overload closes the gate");
    NEAR(s.rate, 2000.0 * exp(10.0 * -0.3 * 0.02));

    /* Sustained overload drives the rate to the floor, no lower. */
    for (int i = 0; i < 500; i++)
        xc_pacer_step(&p, &s, &pid, 1.2, 0.9, s.rate, 0.02);
    NEAR(s.rate, 10.0);

    /* Open -> closed starts from the demand seen (bumpless), cut at most 10x. */
    xc_pacer_reset(&s, 2000.0);
    xc_pid_init(&pid, 50.0, 0.0, 0.0);
    xc_pacer_step(&p, &s, &pid, 0.5, 0.9, 8000.0, 0.02);
    xc_pacer_step(&p, &s, &pid, 1.5, 0.9, 8000.0, 0.02);
    CHECK(s.mode == XC_PACER_CLOSED, "closed after the jump");
    NEAR(s.rate, 800.0);

    /* Growth is at most x2 a period, and it opens once the limit stops binding. */
    xc_pacer_reset(&s, 100.0);
    xc_pid_init(&pid, 1.0, 1000.0, 0.0);
    xc_pacer_step(&p, &s, &pid, 1.0, 0.9, 100.0, 0.02);
    double before = s.rate;
    xc_pacer_step(&p, &s, &pid, 0.1, 0.9, before, 0.02);
    NEAR(s.rate, 2.0 * before);
    CHECK(s.mode == XC_PACER_CLOSED, "still under the cap of the demand's recent peak (100/s): closed");
    /* It keeps doubling until it reaches 2x the (decaying) peak, then opens. */
    int periods = 0;
    while (s.mode == XC_PACER_CLOSED && periods < 10) {
        before = s.rate;
        xc_pacer_step(&p, &s, &pid, 0.1, 0.9, before, 0.02);
        CHECK(s.rate <= 2.0 * before * (1 + 1e-12), "grew more than x2: %g -> %g", before, s.rate);
        periods++;
    }
    CHECK(s.mode == XC_PACER_OPEN, "the limit reached 2x the held demand with room: open (mode %d)", s.mode);
    NEAR(s.rate, 2.0 * s.demand_hold);
    CHECK(periods == 3, "opened after %d more periods, expected 3 (13.5 -> 27 -> 54 -> 108 -> cap ~188)", periods);
}

static void test_meter(void)
{
    struct xc_meter m;
    xc_meter_reset(&m);
    /* No integral published: the latest sample. */
    NEAR(xc_meter_update(&m, 0.7, 0, 0.0, 1000000000ull), 0.7);
    /* The first record with one: its sample (nothing to difference yet). */
    NEAR(xc_meter_update(&m, 0.2, 1, 5.0, 1000000000ull), 0.2);
    /* 20 ms later the integral rose by 0.01 s: the period's mean is 0.5, whatever the latest sample says. */
    NEAR(xc_meter_update(&m, 0.9, 1, 5.01, 1020000000ull), 0.5);
    /* The record did not move since: the same mean. */
    NEAR(xc_meter_update(&m, 0.9, 1, 5.01, 1020000000ull), 0.5);
    /* Gone back in time (the agent restarted): the sample. */
    NEAR(xc_meter_update(&m, 0.3, 1, 0.0, 500000000ull), 0.3);
    NEAR(xc_meter_update(&m, 0.3, 1, 0.004, 510000000ull), 0.4);
    /* A silence over 5 s is a gap: the sample, then means again. */
    NEAR(xc_meter_update(&m, 0.6, 1, 1.0, 6510000001ull), 0.6);
    NEAR(xc_meter_update(&m, 0.6, 1, 1.01, 6530000001ull), 0.5);
    /* An integral that went down: the sample. */
    NEAR(xc_meter_update(&m, 0.1, 1, 0.5, 6550000001ull), 0.1);
}

static void test_demand_hold(void)
{
    struct xc_pacer_params p;
    xc_pacer_params_default(&p, 10.0);
    struct xc_pacer s;
    struct xc_pid pid;
    xc_pacer_reset(&s, 5000.0);
    xc_pid_init(&pid, 0.0, 0.0, 0.0);  /* no change from the PID: only the cap moves the rate */
    xc_pacer_step(&p, &s, &pid, 1.0, 0.5, 5000.0, 0.02);
    CHECK(s.mode == XC_PACER_CLOSED, "overload closes");
    NEAR(s.rate, 5000.0);
    /* The job stops launching (a synchronisation): the cap follows the decaying peak, not the idle period. */
    xc_pacer_step(&p, &s, &pid, 1.0, 0.5, 0.0, 0.02);
    NEAR(s.demand_hold, 5000.0 * exp(-0.02));
    NEAR(s.rate, 5000.0);
    /* Without the hold, one idle period collapses the rate to 2x the floor. */
    p.demand_hold_s = 0.0;
    xc_pacer_step(&p, &s, &pid, 1.0, 0.5, 0.0, 0.02);
    NEAR(s.rate, 20.0);
}

/* Closed loop against a toy GPU: the online service alone keeps U_SM at
 * `online`; each admitted launch/s adds `per_launch` of U_SM, seen one
 * period later; the clock sags linearly with load. With the default gains the
 * load must settle near the target, and again after the online load steps up. */
static void test_closed_loop(void)
{
    struct xc_pacer_params p;
    xc_pacer_params_default(&p, 10.0);
    struct xc_pacer s;
    struct xc_pid pid;
    xc_pacer_reset(&s, 2000.0);
    xc_pid_init(&pid, 1.0, 20.0, 0.0);  /* the XCUDA_KP / XCUDA_KI defaults */
    const double natural = 10000.0, per_launch = 6e-5, target = 0.9, dt = 0.02;
    double served = natural, worst_after_settling = 0.0;
    for (int k = 0; k < 400; k++) {
        double online = k < 200 ? 0.5 : 0.8;
        double u_sm = online + per_launch * served;
        double clock = 1590.0 - 300.0 * (u_sm > 1 ? 1 : u_sm);
        double u_gpu = xc_gpu_load(u_sm, xc_clock_factor(clock, 1290.0, 1590.0, 5.0, 0.5));
        double demand = s.mode == XC_PACER_OPEN ? natural : (s.rate < natural ? s.rate : natural);
        xc_pacer_step(&p, &s, &pid, u_gpu, target, demand, dt);
        served = s.mode == XC_PACER_OPEN ? natural : (s.rate < natural ? s.rate : natural);
        if ((k >= 40 && k < 200) || k >= 240)  /* 40 periods after the start and after the step */
            worst_after_settling = fmax(worst_after_settling, fabs(u_gpu - target));
    }
    CHECK(worst_after_settling < 0.03, "settled within 0.03 of the target: worst %.4f", worst_after_settling);
}

/* -- shared vectors ---------------------------------------------------------- */

#define HEADER "kind,case,step,u_sm,c_sm,t_sm,c_h,a_l,a_h,kp,ki,kd,min_rate,init_rate,target,demand,dt,a_c,u_gpu,mode,rate"

struct row {
    char kind[16];
    int case_id, step;
    double u_sm, c_sm, t_sm, c_h, a_l, a_h, kp, ki, kd, min_rate, init_rate, target, demand, dt;
    double a_c, u_gpu;
    int mode;
    double rate;
};

static void write_row(FILE *f, const struct row *r)
{
    fprintf(f, "%s,%d,%d,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%d,%.17g\n",
            r->kind, r->case_id, r->step, r->u_sm, r->c_sm, r->t_sm, r->c_h, r->a_l, r->a_h, r->kp, r->ki, r->kd,
            r->min_rate, r->init_rate, r->target, r->demand, r->dt, r->a_c, r->u_gpu, r->mode, r->rate);
}

/* Deterministic noise for the generator (the rows record its output). */
static double lcg(unsigned long long *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*x >> 11) / 9007199254740992.0;
}

static void write_vectors(const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    fprintf(f, "%s\n", HEADER);
    int case_id = 0;
    /* Eq. 1-2 on a grid, edges included. */
    const double clocks[] = {-5, 0, 585, 900, 1000, 1289.5, 1290, 1400, 1590, 1700, NAN};
    const double thresholds[] = {1290, 1000, 0};
    const double tops[] = {1590, 1290, 900};
    const double gains[][2] = {{5.0, 0.5}, {10.0, 0.2}, {0.0, 0.0}, {2.5, 1.0}};
    const double usm[] = {0.0, 0.35, 1.0, 1.3};
    for (size_t a = 0; a < sizeof clocks / sizeof *clocks; a++)
        for (size_t b = 0; b < sizeof thresholds / sizeof *thresholds; b++)
            for (size_t c = 0; c < sizeof tops / sizeof *tops; c++)
                for (size_t g = 0; g < sizeof gains / sizeof *gains; g++) {
                    struct row r;
                    memset(&r, 0, sizeof r);
                    strcpy(r.kind, "clock");
                    r.case_id = case_id;
                    r.c_sm = clocks[a], r.t_sm = thresholds[b], r.c_h = tops[c];
                    r.a_l = gains[g][0], r.a_h = gains[g][1];
                    r.u_sm = usm[(a + b + c + g) % 4];
                    r.a_c = xc_clock_factor(r.c_sm, r.t_sm, r.c_h, r.a_l, r.a_h);
                    r.u_gpu = xc_gpu_load(r.u_sm, r.a_c);
                    write_row(f, &r);
                }
    case_id++;

    /* Pacer sequences over a toy GPU (see test_closed_loop), various regimes. */
    struct scenario {
        double kp, ki, kd, min_rate, init_rate, target, online, per_launch, natural, noise, dt_jitter;
        int steps;
    } scenarios[] = {
        {1.0, 10.0, 0.0, 10, 2000, 0.9, 0.2, 1e-5, 5000, 0.00, 0.0, 40},    /* light: opens, stays open */
        {1.0, 10.0, 0.0, 10, 2000, 0.9, 1.0, 1e-5, 5000, 0.00, 0.0, 60},    /* online alone saturates: floor */
        {1.0, 10.0, 0.0, 10, 2000, 0.9, 0.5, 6e-5, 10000, 0.00, 0.0, 120}, /* settles at the target */
        {2.0, 25.0, 0.05, 5, 500, 0.8, 0.4, 1e-4, 8000, 0.05, 0.3, 150},   /* noisy, Kd, jittered periods */
        {0.5, 4.0, 0.0, 20, 3000, 1.1, 0.6, 3e-5, 20000, 0.02, 0.0, 100},  /* a_C < 1 lets it run hotter */
        {1.0, 10.0, 0.0, 10, 2000, 0.9, -1, 5e-5, 10000, 0.00, 0.0, 150},  /* online load steps up and down */
    };
    for (size_t sc = 0; sc < sizeof scenarios / sizeof *scenarios; sc++, case_id++) {
        const struct scenario *z = &scenarios[sc];
        struct xc_pacer_params p;
        xc_pacer_params_default(&p, z->min_rate);
        struct xc_pacer s;
        struct xc_pid pid;
        xc_pacer_reset(&s, z->init_rate);
        xc_pid_init(&pid, z->kp, z->ki, z->kd);
        unsigned long long seed = 12345 + sc;
        double served = z->natural;
        for (int k = 0; k < z->steps; k++) {
            struct row r;
            memset(&r, 0, sizeof r);
            strcpy(r.kind, "pacer");
            r.case_id = case_id;
            r.step = k;
            double online = z->online >= 0 ? z->online : (k < 50 ? 0.3 : (k < 100 ? 0.85 : 0.4));
            double u = online + z->per_launch * served + z->noise * (lcg(&seed) - 0.5);
            r.u_sm = u;
            r.t_sm = 1290.0, r.c_h = 1590.0;
            r.c_sm = 1590.0 - 300.0 * (u > 1 ? 1 : (u < 0 ? 0 : u));
            r.a_l = 5.0, r.a_h = 0.5;
            r.kp = z->kp, r.ki = z->ki, r.kd = z->kd;
            r.min_rate = z->min_rate, r.init_rate = z->init_rate, r.target = z->target;
            r.demand = s.mode == XC_PACER_OPEN ? z->natural : (s.rate < z->natural ? s.rate : z->natural);
            r.dt = 0.02 * (1.0 + z->dt_jitter * (lcg(&seed) - 0.5));
            if (sc == 3 && k == 70)
                r.dt = 0.0;  /* a period of length zero: P only */
            r.a_c = xc_clock_factor(r.c_sm, r.t_sm, r.c_h, r.a_l, r.a_h);
            r.u_gpu = xc_gpu_load(r.u_sm, r.a_c);
            xc_pacer_step(&p, &s, &pid, r.u_gpu, r.target, r.demand, r.dt);
            r.mode = (int)s.mode;
            r.rate = s.rate;
            served = s.mode == XC_PACER_OPEN ? z->natural : (s.rate < z->natural ? s.rate : z->natural);
            write_row(f, &r);
        }
    }
    fclose(f);
}

static void check_vectors(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        perror(path);
        failures++;
        return;
    }
    char line[1024];
    if (fgets(line, sizeof line, f) == NULL || strncmp(line, HEADER, strlen(HEADER)) != 0) {
        CHECK(0, "%s: unexpected header", path);
        fclose(f);
        return;
    }
    struct xc_pacer_params p;
    struct xc_pacer s;
    struct xc_pid pid;
    int current_case = -1, rows = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        struct row r;
        int n = sscanf(line,
                       "%15[^,],%d,%d,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%d,%lf",
                       r.kind, &r.case_id, &r.step, &r.u_sm, &r.c_sm, &r.t_sm, &r.c_h, &r.a_l, &r.a_h, &r.kp,
                       &r.ki, &r.kd, &r.min_rate, &r.init_rate, &r.target, &r.demand, &r.dt, &r.a_c, &r.u_gpu,
                       &r.mode, &r.rate);
        CHECK(n == 21, "bad row: %s", line);
        if (n != 21)
            continue;
        rows++;
        double a_c = xc_clock_factor(r.c_sm, r.t_sm, r.c_h, r.a_l, r.a_h);
        double u_gpu = xc_gpu_load(r.u_sm, a_c);
        CHECK(close_to(a_c, r.a_c), "case %d step %d: a_C %.17g != %.17g", r.case_id, r.step, a_c, r.a_c);
        CHECK(close_to(u_gpu, r.u_gpu), "case %d step %d: U_GPU %.17g != %.17g", r.case_id, r.step, u_gpu, r.u_gpu);
        if (strcmp(r.kind, "pacer") != 0)
            continue;
        if (r.case_id != current_case) {
            current_case = r.case_id;
            xc_pacer_params_default(&p, r.min_rate);
            xc_pacer_reset(&s, r.init_rate);
            xc_pid_init(&pid, r.kp, r.ki, r.kd);
        }
        xc_pacer_step(&p, &s, &pid, u_gpu, r.target, r.demand, r.dt);
        CHECK((int)s.mode == r.mode, "case %d step %d: mode %d != %d", r.case_id, r.step, (int)s.mode, r.mode);
        CHECK(close_to(s.rate, r.rate), "case %d step %d: rate %.17g != %.17g", r.case_id, r.step, s.rate, r.rate);
    }
    fclose(f);
    CHECK(rows > 500, "only %d vector rows", rows);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write")) {
        write_vectors(argv[2]);
        return 0;
    }
    test_clock_factor();
    test_pid();
    test_pacer();
    test_meter();
    test_demand_hold();
    test_closed_loop();
    if (argc == 2)
        check_vectors(argv[1]);
    if (failures) {
        fprintf(stderr, "test_control: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_control: ok\n");
    return 0;
}
