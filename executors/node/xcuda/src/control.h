/*
 * Controller maths of xCUDA's compute pacing (paper §4.1, Eq. 1-2, PID),
 * CUDA-free and side-effect-free so it is unit-tested on its own and mirrored
 * line for line by scheduler_core/guard/xcuda_control.py.
 *
 * Control variable: the GPU load U_GPU = U_SM * a_C. Actuator: the offline
 * process's kernel-launch rate. The PID works on ln(rate) in velocity form,
 * so the gains do not depend on how many kernels a job launches per second,
 * and the clamped rate is the only integrator (no integral wind-up).
 */
#ifndef XCUDA_CONTROL_H
#define XCUDA_CONTROL_H

/* Eq. 2: clock factor a_C from the SM clock c_sm, threshold t_sm, highest
 * clock c_h (MHz). 1 when the clock information is missing. */
double xc_clock_factor(double c_sm, double t_sm, double c_h, double a_l, double a_h);

/* Eq. 1: U_GPU = U_SM * a_C, with U_SM clamped to [0, 1]; NaN stays NaN. */
double xc_gpu_load(double u_sm, double a_c);

struct xc_pid {
    double kp, ki, kd;
    double e1, e2;  /* the two previous errors */
    int primed;     /* 0 until the first error is seen */
};

void xc_pid_init(struct xc_pid *pid, double kp, double ki, double kd);

/* Velocity-form PID: the change of ln(rate) for error e = target - U_GPU
 * over dt_s seconds: kp*(e - e1) + ki*e*dt + kd*(e - 2*e1 + e2)/dt. */
double xc_pid_delta(struct xc_pid *pid, double error, double dt_s);

enum xc_pacer_mode { XC_PACER_FRESH = 0, XC_PACER_CLOSED = 1, XC_PACER_OPEN = 2 };

struct xc_pacer_params {
    double min_rate;       /* launches/s floor */
    double headroom;       /* the limit never exceeds headroom * demand */
    double max_step_up;    /* per period, on ln(rate) */
    double max_step_down;
    double demand_hold_s;  /* the demand the cap follows decays over this time constant, so a job that
                              stops launching for a while (a synchronisation, data loading) keeps its rate */
};

struct xc_pacer {
    enum xc_pacer_mode mode;
    double rate;           /* launches/s allowed (OPEN: the cap it would have) */
    double demand_hold;    /* the recent peak of the demand, decaying over demand_hold_s */
};

void xc_pacer_params_default(struct xc_pacer_params *p, double min_rate);
void xc_pacer_reset(struct xc_pacer *s, double initial_rate);

/*
 * The U_SM a control period acts on. The node agent publishes, beside its latest
 * sample, the running integral of U_SM over time; the mean since the previous
 * period's read is what the GPU did in the period (the latest sample alone sees
 * only its own window: with the agent sampling every 10 ms and the controller
 * granting launches every 20 ms, it would alias with the job's bursts and
 * settle away from the target). Without the integral (an older agent), after a
 * gap or when the record went back in time, the latest sample is used.
 */
struct xc_meter {
    int primed;
    double integral_s;
    unsigned long long ts_ns;
    double last;
};

void xc_meter_reset(struct xc_meter *m);
double xc_meter_update(struct xc_meter *m, double u_sm, int has_integral, double integral_s,
                       unsigned long long ts_ns);

/*
 * One control period: U_GPU measured, the target, the launch demand seen in
 * the period (launches/s asked for, admitted or waiting) and its length.
 * OPEN means the limiter is not binding and launches go through unpaced.
 */
void xc_pacer_step(const struct xc_pacer_params *p, struct xc_pacer *s, struct xc_pid *pid,
                   double u_gpu, double target, double demand_rate, double dt_s);

#endif
