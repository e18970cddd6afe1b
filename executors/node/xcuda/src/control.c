/* See control.h. Mirrored by scheduler_core/guard/xcuda_control.py: change both. */
#include "control.h"

#include <math.h>

static double clamp(double x, double lo, double hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

double xc_clock_factor(double c_sm, double t_sm, double c_h, double a_l, double a_h)
{
    if (!(t_sm > 0.0) || !isfinite(t_sm) || !isfinite(c_sm))
        return 1.0;
    double a;
    if (c_sm < t_sm) {
        double c = c_sm > 0.0 ? c_sm : 0.0;
        a = 1.0 + a_l * (t_sm - c) / t_sm;
    } else {
        if (!(c_h > t_sm) || !isfinite(c_h))
            return 1.0;  /* threshold at the top clock: no bonus for a high clock */
        double c = c_sm < c_h ? c_sm : c_h;
        a = 1.0 - a_h * (c - t_sm) / (c_h - t_sm);
    }
    return a > 0.0 ? a : 0.0;
}

double xc_gpu_load(double u_sm, double a_c)
{
    if (isnan(u_sm) || isnan(a_c))
        return NAN;
    return clamp(u_sm, 0.0, 1.0) * a_c;
}

void xc_pid_init(struct xc_pid *pid, double kp, double ki, double kd)
{
    pid->kp = kp;
    pid->ki = ki;
    pid->kd = kd;
    pid->e1 = 0.0;
    pid->e2 = 0.0;
    pid->primed = 0;
}

double xc_pid_delta(struct xc_pid *pid, double error, double dt_s)
{
    if (!pid->primed) {
        /* No history yet: no proportional or derivative kick. */
        pid->e1 = error;
        pid->e2 = error;
        pid->primed = 1;
    }
    double d = pid->kp * (error - pid->e1);
    if (dt_s > 0.0 && isfinite(dt_s)) {
        d += pid->ki * error * dt_s;
        d += pid->kd * (error - 2.0 * pid->e1 + pid->e2) / dt_s;
    }
    pid->e2 = pid->e1;
    pid->e1 = error;
    return d;
}

void xc_pacer_params_default(struct xc_pacer_params *p, double min_rate)
{
    p->min_rate = min_rate;
    p->headroom = 2.0;
    p->max_step_up = log(2.0);     /* grow at most x2 a period: give the online service time to react */
    p->max_step_down = log(10.0);  /* cut at most x10 a period: protect it fast */
    p->demand_hold_s = 1.0;
}

void xc_pacer_reset(struct xc_pacer *s, double initial_rate)
{
    s->mode = XC_PACER_FRESH;
    s->rate = initial_rate;
    s->demand_hold = 0.0;
}

#define XC_METER_MAX_GAP_NS 5000000000ull  /* a longer silence is a gap: start again from the sample */

void xc_meter_reset(struct xc_meter *m)
{
    m->primed = 0;
    m->integral_s = 0.0;
    m->ts_ns = 0;
    m->last = NAN;
}

double xc_meter_update(struct xc_meter *m, double u_sm, int has_integral, double integral_s,
                       unsigned long long ts_ns)
{
    if (!has_integral || !isfinite(integral_s)) {
        m->primed = 0;
        m->last = u_sm;
        return u_sm;
    }
    double u = u_sm;
    if (m->primed && ts_ns == m->ts_ns && integral_s == m->integral_s) {
        u = m->last;  /* no new sample since the last period: the same mean */
    } else if (m->primed && ts_ns > m->ts_ns && ts_ns - m->ts_ns <= XC_METER_MAX_GAP_NS &&
               integral_s >= m->integral_s) {
        u = (integral_s - m->integral_s) / ((double)(ts_ns - m->ts_ns) / 1e9);
    }
    m->primed = 1;
    m->integral_s = integral_s;
    m->ts_ns = ts_ns;
    m->last = u;
    return u;
}

void xc_pacer_step(const struct xc_pacer_params *p, struct xc_pacer *s, struct xc_pid *pid,
                   double u_gpu, double target, double demand_rate, double dt_s)
{
    double e = target - u_gpu;
    double d = clamp(xc_pid_delta(pid, e, dt_s), -p->max_step_down, p->max_step_up);
    double demand = demand_rate > p->min_rate ? demand_rate : p->min_rate;
    double hold = demand;
    if (p->demand_hold_s > 0.0) {
        double decayed = s->demand_hold * (dt_s > 0.0 && isfinite(dt_s) ? exp(-dt_s / p->demand_hold_s) : 1.0);
        if (decayed > hold)
            hold = decayed;
    }
    s->demand_hold = hold;
    double cap = p->headroom * hold;

    switch (s->mode) {
    case XC_PACER_FRESH:
        if (e >= 0.0) {
            s->mode = XC_PACER_OPEN;
            s->rate = cap;
        } else {
            s->mode = XC_PACER_CLOSED;
            s->rate = clamp((s->rate < cap ? s->rate : cap) * exp(d), p->min_rate, cap);
        }
        break;
    case XC_PACER_OPEN:
        if (e >= 0.0) {
            s->rate = cap;
        } else {
            /* Close from what the job was actually doing (bumpless). */
            s->mode = XC_PACER_CLOSED;
            s->rate = clamp(demand * exp(d), p->min_rate, cap);
        }
        break;
    case XC_PACER_CLOSED:
    default:
        s->rate = clamp((s->rate < cap ? s->rate : cap) * exp(d), p->min_rate, cap);
        if (e >= 0.0 && s->rate >= cap)
            s->mode = XC_PACER_OPEN;  /* the limit no longer binds and there is room */
        break;
    }
}
