"""The speed predictor, one partition per GPU type: a trained candidate, its held-out check, the promoted model.

``speed_predictor_candidate`` trains on every co-location sample of its GPU
type and stores an unpromoted version. Its blocking check
``holdout_error_within_bound`` fails when the held-out MAE of normalized
throughput exceeds the configured bound; a failed check stops the run before
``speed_predictor``, so that model is never promoted. ``speed_predictor``
promotes the latest version if it is also no worse than the current one.
"""


from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    MaterializeResult,
    StaticPartitionsDefinition,
    asset,
)

from assets.resources import PredictorStoreResource

GROUP = "predictor"
CHECK = "holdout_error_within_bound"


def build_predictor_assets(gpu_types: tuple[str, ...]) -> tuple[list, StaticPartitionsDefinition]:
    partitions = StaticPartitionsDefinition(sorted(gpu_types))

    @asset(
        group_name=GROUP, partitions_def=partitions, deps=["colocation_samples"],
        check_specs=[AssetCheckSpec(CHECK, asset="speed_predictor_candidate", blocking=True,
                                    description="held-out MAE of normalized throughput within the configured bound")],
        description="A newly trained MLP for this GPU type (stored unpromoted, with its held-out error).",
    )
    def speed_predictor_candidate(context: AssetExecutionContext, predictors: PredictorStoreResource) -> MaterializeResult:
        gtype = context.partition_key
        t = predictors.train_candidate(gtype)
        bound = predictors.max_holdout_mae
        ok = t.holdout_mae_tput <= bound
        return MaterializeResult(
            metadata={
                "gpu_type": gtype, "version": t.version, "training_samples": t.n_train,
                "holdout_samples": t.n_holdout, "holdout_mae_norm_tput": round(t.holdout_mae_tput, 4),
                "holdout_mae_online_slowdown": round(t.holdout_mae_slowdown, 4), "trained_on": t.trained_on,
                **({"holdout_mape_norm_tput_pct": round(100 * t.holdout_mape_tput, 2)}
                   if t.holdout_mape_tput is not None else {}),
            },
            check_results=[AssetCheckResult(
                check_name=CHECK, passed=ok, severity=AssetCheckSeverity.ERROR,
                description=None if ok else f"v{t.version} held-out MAE {t.holdout_mae_tput:.4f} > bound {bound}: not promoted",
                metadata={"holdout_mae_norm_tput": round(t.holdout_mae_tput, 4), "bound": bound, "version": t.version},
            )],
        )

    @asset(
        group_name=GROUP, partitions_def=partitions, deps=[speed_predictor_candidate],
        description="The promoted model of this GPU type: the latest candidate if its error is within the bound "
                    "and no worse than the current model's.",
    )
    def speed_predictor(context: AssetExecutionContext, predictors: PredictorStoreResource) -> MaterializeResult:
        p = predictors.promote_latest(context.partition_key)
        if p.promoted:
            context.log.info("GPU type %s: v%s promoted (%s)", p.gpu_type, p.version, p.reason)
        else:
            context.log.warning("GPU type %s: v%s not promoted (%s); v%s stays", p.gpu_type, p.version, p.reason,
                                p.previous_version)
        return MaterializeResult(metadata={
            "gpu_type": p.gpu_type, "candidate_version": p.version, "promoted": p.promoted,
            "serving_version": p.version if p.promoted else (p.previous_version or 0), "reason": p.reason,
        })

    return [speed_predictor_candidate, speed_predictor], partitions
