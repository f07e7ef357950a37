"""Cold-start table on MovieLens 100K (../shared/DESIGN.md, "Cold-start evaluation protocol"),
through the product path a user runs: ``gmeta tune`` -> ``gmeta train`` -> ``gmeta eval``.

For each seed: the ``movielens`` pipeline with that seed for the split (80% warm users, a
fifth of them held out for validation, 10 random query ratings per user, validation and
cold users with 13-100 ratings; warm users with more are trained on, ``train_long_tasks``),
the initial weights and the batch order (``--ratings-only``: the same pipeline copied onto
``u.data`` alone through the csv source, ``item_id`` its only feature). Then:

1. ``gmeta tune`` (``--trials`` N): two Optuna studies with the same N trials, one for the
   meta model (inner steps and rates, learned per-step/per-element rates, multi-step loss,
   outer rate, its tables' rate), one for the baseline (its learning rate, its tables'
   rate, fine-tuning rate and steps). Each
   trial trains both on the same batches, each with its own early stopping; its value is
   each model's best validation AUC. Only the validation users are scored.
2. ``gmeta train`` with the chosen settings; each model's best checkpoint on validation.
3. ``gmeta eval``: every cold user, scored once: the meta model adapted on its support
   ratings, the baseline fine-tuned on them through the same inner-loop code and the same
   fast weights, both without adaptation, and the reference predictors (global mean, item
   mean, item mean + the user's mean offset on its support ratings; their damping chosen
   on the validation users).

Metrics on cold users' query ratings: AUC (label = rating >= 4, score = predicted rating,
pooled), MAE, nDCG@3 per user (relevance = rating). Every contender is reported as mean and
standard deviation over the seeds, and the meta model's paired difference against every
other row per seed (> 0: the meta model is better; MAE: the other's minus the meta's) with
the 95% interval ``gmeta eval`` gives it (paired bootstrap over the seed's cold users).

Result (``python -m benchmarks.cold_start --seeds 0,1,2,3,4 --trials 8 --jobs 2``,
2026-11-25 at 7a31edb, 49 minutes beside a CI run; the pipeline as shipped, warm users
with more than 100 ratings trained on; each model early-stopped on its own patience;
cold users 129 / 110 / 123 / 114 / 125, scored once per seed; mean +- std over seeds):

  row                                  AUC              MAE              nDCG@3
  meta (maml)                          0.7533 +-0.0100  0.7658 +-0.0103  0.8677 +-0.0040
  meta, no adaptation                  0.6575 +-0.0093  0.8760 +-0.0129  0.8604 +-0.0041
  baseline fine-tuned                  0.7477 +-0.0097  0.7741 +-0.0094  0.8631 +-0.0065
  baseline, no fine-tuning             0.6548 +-0.0042  0.8801 +-0.0110  0.8621 +-0.0058
  reference: global mean               0.5000           0.9562 +-0.0102  0.7885 +-0.0126
  reference: item_id mean              0.6861 +-0.0163  0.8465 +-0.0136  0.8638 +-0.0042
  reference: item_id mean + offset     0.7475 +-0.0125  0.7764 +-0.0150  0.8638 +-0.0042

Paired per seed (meta minus other, > 0 better): against the fine-tuned baseline AUC
+0.0022/+0.0108/+0.0036/+0.0119/-0.0008, MAE +0.0051/+0.0144/+0.0019/+0.0133/+0.0071,
nDCG@3 +0.0014/-0.0004/+0.0092/+0.0172/-0.0046 (12 of 15); against item mean + offset AUC
-0.0018/+0.0153/+0.0040/+0.0066/+0.0047, MAE +0.0099/+0.0250/+0.0047/+0.0038/+0.0096,
nDCG@3 +0.0014/+0.0020/+0.0055/+0.0128/-0.0023 (13 of 15; the item mean has the same
nDCG@3). Over the seeds MAML minus the baseline is AUC +0.0055 [-0.0001, +0.0112], MAE
+0.0084 [+0.0023, +0.0144], nDCG@3 +0.0046 [-0.0020, +0.0112]; against item mean +
offset AUC +0.0058 [-0.0005, +0.0121], MAE +0.0106 [+0.0033, +0.0179], nDCG@3 +0.0039
[-0.0031, +0.0108]. Three tuning trials' meta models diverged (seed 0's trial 4 and
seed 4's trial 3 at step 25, before their first validation; seed 1's trial 7 at step
275); their baselines trained on in the same runs and were scored. The same command earlier
that day, when a trial's two models shared one early-stopping count (60fc210, 54
minutes): MAML 0.7538 / 0.7651 / 0.8641, the baseline 0.7482 / 0.7741 / 0.8612, 12 of 15
per-seed comparisons won against each.

``--ratings-only --seeds 0,1,2`` (2026-11-25 at 7a31edb, 21 minutes beside a CI run):
MAML 0.7454 / 0.7739 / 0.8623 (AUC / MAE / nDCG@3, mean over seeds), the fine-tuned
baseline 0.7429 / 0.7773 / 0.8580, item mean + offset 0.7417 / 0.7831 / 0.8651. Against
the baseline AUC +0.0003/+0.0080/-0.0008, MAE +0.0052/+0.0063/-0.0015, nDCG@3
-0.0027/-0.0024/+0.0181 (5 of 9); against item mean + offset AUC -0.0049/+0.0139/+0.0022,
MAE +0.0098/+0.0131/+0.0045, nDCG@3 -0.0130/-0.0034/+0.0080 (6 of 9). At 60fc210 (shared
early stopping): MAML 0.7457 / 0.7721 / 0.8572, the baseline 0.7418 / 0.7780 / 0.8585.

The same ``--ratings-only`` command at 177379c (each study also searching its tables'
learning rate; 30 minutes at ``--jobs 1`` beside a CI run): MAML 0.7477 / 0.7718 /
0.8591, the baseline 0.7417 / 0.7777 / 0.8598, item mean + offset 0.7417 / 0.7831 /
0.8651; against the baseline AUC -0.0022/+0.0145/+0.0058, MAE +0.0014/+0.0111/+0.0051,
nDCG@3 -0.0069/-0.0030/+0.0078 (6 of 9); against item mean + offset AUC
-0.0074/+0.0203/+0.0053, MAE +0.0061/+0.0179/+0.0098, nDCG@3 -0.0172/-0.0040/+0.0031 (6
of 9). MAML chose table rates 0.034 / 0.178 / 0.05; the baseline kept its own (0.05).

``--ratings-only --split-items 5 --users 670 --seeds 0,1,2`` (2026-11-25 at 25087c4, 36
minutes at ``--jobs 1`` beside another benchmark and a CI run): ``u.data`` with 670 users,
each item split into 5 by a hash of the user (6,567 items with about 10 ratings each, as
in a larger catalogue with as many ratings; cold users 90 / 71 / 89). MAML 0.7215 / 0.8159
/ 0.8428, the fine-tuned baseline 0.7200 / 0.8181 / 0.8413, item mean + offset 0.7288 /
0.8105 / 0.8478. Against the baseline AUC -0.0021/+0.0031/+0.0034, MAE
-0.0045/+0.0058/+0.0053, nDCG@3 +0.0020/+0.0006/+0.0016 (7 of 9); against item mean +
offset AUC -0.0111/-0.0050/-0.0059, MAE -0.0072/-0.0065/-0.0024, nDCG@3
-0.0179/+0.0053/-0.0026 (1 of 9). The same command with the library of 4f871ba (before
each study searched its tables' learning rate): MAML 0.7197 / 0.8211 / 0.8458, the
baseline 0.7223 / 0.8159 / 0.8475 (4 of 9 against the baseline, 2 of 9 against the
offset model). On rare items the damped item mean beats both neural contenders.
Tried on this data's validation users and not kept (``gmeta train`` with the shipped
settings, split seeds 0 / 1 / 2, ``gmeta eval --validation``; item mean + offset there
0.7148 / 0.7035 / 0.7293 AUC, 0.7967 / 0.8296 / 0.8615 MAE): MAML 0.7130 / 0.6933 /
0.7367 AUC and 0.8100 / 0.8347 / 0.8464 MAE as shipped; the item bias of ``model.linear``
(best training-validation AUC 0.7171 / 0.6927 / 0.6998 against 0.7171 / 0.6928 / 0.7025
without); embedding width 4 or 8 instead of 16 (0.7084 / 0.6948 / 0.7202 and 0.7120 /
0.6931 / 0.7197 AUC); a Gaussian prior on the item rows spread over each item's warm
rows (each row adding ``lambda * ||row||^2 / n_item`` to the loss, so a rare item's row
shrinks as a damped mean does; Zhou et al. KDD 2018) at lambda 3 / 10 / 30: AUC 0.7091
/ 0.6929 / 0.7134, 0.7142 / 0.6938 / 0.7139, 0.7107 / 0.6936 / 0.7388, MAE no better
than 0.8080 / 0.8340 / 0.8462. None came nearer the offset model than the run-to-run
spread.

With ``gmeta tune`` keeping the pipeline's own settings unless a challenger's mean beats
them by more than one standard error (c995e67, the fitted blend as shipped; 2026-11-27,
``--seeds 0,1,2 --trials 8 --jobs 1``, 104 minutes beside a CI run): MovieLens 100K, MAML
0.7583 / 0.7590 / 0.8743, the baseline 0.7575 / 0.7630 / 0.8726, the factorisation 0.7583
/ 0.7657 / 0.8747; against the baseline AUC +0.0011/+0.0010/+0.0002, MAE
+0.0069/+0.0002/+0.0050, nDCG@3 +0.0044/-0.0090/+0.0097 (8 of 9), against the
factorisation AUC -0.0000/+0.0075/-0.0075, MAE +0.0091/+0.0064/+0.0049, nDCG@3
+0.0052/-0.0040/-0.0025 (5 of 9), against item mean + offset 9 of 9; not reached. The rule
kept MAML's k = 5 on seeds 1 and 2 (challengers k = 1 and k = 3 were ahead by 0.0008 and
0.0009, inside margins of 0.0015 and 0.0014) and changed no choice of the baseline's.

With both models blended half and half with the factorisation's fold-in
(``--set model.prior.blend=0.5``, shipped in ``pipelines/movielens.yaml`` from 5c132ab to
8f88860, checkpoints and tune choosing on the blended predictions; run
at 8328757, 2026-11-27, ``--seeds 0,1,2 --trials 8 --jobs 1``, seed 2 as a second process
of the same command beside a CI run): MovieLens 100K, MAML 0.7596 / 0.7612 / 0.8759, the
baseline 0.7575 / 0.7628 / 0.8727, the factorisation 0.7583 / 0.7657 / 0.8747; against the
baseline AUC +0.0028/-0.0002/+0.0038, MAE +0.0034/-0.0049/+0.0063, nDCG@3
-0.0006/+0.0023/+0.0079 (6 of 9), against the factorisation AUC +0.0002/+0.0064/-0.0025,
MAE +0.0086/+0.0007/+0.0042, nDCG@3 +0.0011/+0.0070/-0.0047 (7 of 9), against item mean +
offset 9 of 9; not reached. The rare-item command with it (at 10d790e): MAML 0.7371 /
0.7963 / 0.8634, the baseline 0.7389 / 0.8104 / 0.8614, the factorisation 0.7381 / 0.7962
/ 0.8611; against the baseline 5 of 9, the factorisation 3 of 9 (fitted blend: 5 and 5),
item mean + offset 7 of 9; not reached, and the pipeline went back to the fitted blend.

With each model's adapted predictions blended with the factorisation's own fold-in at the
weight chosen on validation (``model.prior.blend`` unset, shipped from b410027 to 5c132ab
and again from 8f88860; run at
dc6a125, 2026-11-26, ``--seeds 0,1,2 --trials 8 --jobs 1``, 77 minutes beside the
rare-item run and a CI run; the rows "meta, not blended with the fold-in" and "baseline,
not blended with the fold-in" reproduce the run below): MovieLens 100K, MAML 0.7577 /
0.7644 / 0.8761 (blends 0.47 / 0.78 / 1), the baseline 0.7571 / 0.7631 / 0.8722 (0.21 /
0.57 / 0.44), the factorisation 0.7583 / 0.7657 / 0.8747; against the baseline AUC
+0.0010/-0.0035/+0.0043, MAE +0.0067/-0.0104/-0.0002, nDCG@3 +0.0048/-0.0003/+0.0073 (5
of 9), against the factorisation AUC -0.0000/+0.0028/-0.0044, MAE
+0.0088/-0.0041/-0.0008, nDCG@3 +0.0048/+0.0055/-0.0062 (4 of 9), against item mean +
offset 9 of 9; not reached. The rare-item command (63 minutes): MAML 0.7407 / 0.7948 /
0.8578, the baseline 0.7393 / 0.7949 / 0.8612, the factorisation 0.7381 / 0.7962 /
0.8611; against the baseline 5 of 9, the factorisation 5 of 9, item mean + offset 8 of
9; not reached. The blend lifts both models about equally (MAML's AUC +0.0027 [+0.0010,
+0.0045] on MovieLens, +0.0010 on rare items).

With the factor prior's fold-in strength chosen with its L2 on validation and the factor
weights and bias of both models' ridge solve shrunk at it (``model.prior.fold_in``, the
default since 3bdb52f; 2026-11-26, ``--seeds 0,1,2 --trials 8 --jobs 1``, 80 minutes
beside the rare-item run and a CI run): MovieLens 100K, MAML 0.7550 / 0.7654 / 0.8739,
the baseline 0.7534 / 0.7620 / 0.8706, the factorisation 0.7583 / 0.7657 / 0.8747;
against the baseline AUC +0.0025/-0.0060/+0.0081, MAE +0.0027/-0.0159/+0.0028, nDCG@3
+0.0061/-0.0013/+0.0052 (6 of 9: seed 1, where tune chose k = 1, lost all three),
against the factorisation AUC -0.0045/-0.0009/-0.0044, MAE +0.0098/-0.0081/-0.0008,
nDCG@3 +0.0026/+0.0010/-0.0062 (3 of 9), against item mean + offset 9 of 9; not
reached. The rare-item command: MAML 0.7397 / 0.7962 / 0.8568 (from 0.7325 / 0.8061 /
0.8534), the baseline 0.7380 / 0.7970 / 0.8569, the factorisation 0.7381 / 0.7962 /
0.8611; against the baseline 6 of 9 (from 1), the factorisation 5 of 9 (from 1), item
mean + offset 8 of 9 (from 6); not reached.

With the ridge strengths learned at their own rate (``meta.ridge_lr`` 0.02, the default
since d395959; the pipeline as shipped; 2026-11-26, ``--seeds 0,1,2 --trials 8 --jobs
1``): MovieLens 100K, MAML 0.7566 / 0.7611 / 0.8756, the baseline 0.7519 / 0.7618 /
0.8694 (the figures of the run below), the factorisation 0.7583 / 0.7657 / 0.8747;
against the baseline AUC +0.0067/+0.0033/+0.0041, MAE +0.0049/-0.0038/+0.0011, nDCG@3
+0.0084/+0.0049/+0.0051 (8 of 9), against the factorisation AUC
-0.0039/+0.0057/-0.0068, MAE +0.0105/+0.0012/+0.0023, nDCG@3 +0.0045/+0.0036/-0.0055
(6 of 9; not reached), against item mean + offset 9 of 9. The rare-item command: MAML
0.7325 / 0.8061 / 0.8534, the baseline 0.7330 / 0.8016 / 0.8612, the factorisation
0.7381 / 0.7962 / 0.8611 (1 of 9 against each; not reached).

With the factor prior and ridge (``model.prior.factors: 32``, ``meta.ridge: 10``, the
pipeline as shipped from f66c388; run on 415d82b with those two ``--set``, 2026-11-26):
MovieLens 100K, ``--seeds 0,1,2 --trials 8``: MAML 0.7587 / 0.7585 / 0.8733, the
baseline 0.7519 / 0.7618 / 0.8694, the matrix-factorisation fold-in reference 0.7583 /
0.7657 / 0.8747, item mean + offset 0.7417 / 0.7831 / 0.8651; against the baseline AUC
+0.0034/+0.0109/+0.0060, MAE +0.0018/+0.0085/-0.0003, nDCG@3 +0.0055/+0.0006/+0.0055 (8
of 9), against the factorisation AUC -0.0072/+0.0133/-0.0049, MAE
+0.0074/+0.0136/+0.0009, nDCG@3 +0.0015/-0.0007/-0.0051 (5 of 9; not reached). The
rare-item command: MAML 0.7317 / 0.8070 / 0.8541, the baseline 0.7330 / 0.8016 / 0.8612,
the factorisation 0.7381 / 0.7962 / 0.8611 (2 of 9 against the baseline, 3 of 9 against
the factorisation; not reached).

With the label prior read out of fold by training rows (``model.prior.folds: 5``, the
default; 2026-11-26 at 6567c48, the pipeline as shipped): MovieLens 100K, ``--seeds 0,1,2
--trials 8``: MAML 0.7524 / 0.7638 / 0.8767 (AUC / MAE / nDCG@3), the baseline 0.7448 /
0.7744 / 0.8632, item mean + offset 0.7417 / 0.7831 / 0.8651; MAML ahead of every
contender on every seed and metric (against the baseline AUC +0.0044/+0.0149/+0.0035,
MAE +0.0041/+0.0215/+0.0060, nDCG@3 +0.0057/+0.0131/+0.0217; against item mean + offset
AUC +0.0038/+0.0191/+0.0091, MAE +0.0134/+0.0295/+0.0149, nDCG@3
+0.0034/+0.0138/+0.0175): the target. The rare-item command with
``--set model.prior.feature=item_id``: MAML 0.7314 / 0.8047 / 0.8506, the baseline
0.7312 / 0.8050 / 0.8499, item mean + offset 0.7288 / 0.8105 / 0.8478 (7 of 9 against
the offset model, 3 of 9 against the baseline: level with it; not reached).

With the label prior read in-sample (every row its own label included; before
``pipelines/movielens.yaml`` shipped it; 2026-11-26 at 4563001): the rare-item command
above gave MAML 0.7302 / 0.8043 / 0.8438, the baseline 0.7289 / 0.8094 / 0.8478, item
mean + offset 0.7288 / 0.8105 / 0.8478; against item mean + offset AUC
-0.0042/+0.0073/+0.0011, MAE +0.0038/+0.0120/+0.0027, nDCG@3 -0.0102/-0.0006/-0.0015 (5
of 9, from 1 of 9); against the baseline 4 of 9. MovieLens 100K with features, ``--seeds
0,1,2 --trials 8``: MAML 0.7496 / 0.7664 / 0.8669, the baseline 0.7446 / 0.7743 /
0.8628, item mean + offset 0.7417 / 0.7831 / 0.8651; against the baseline AUC
-0.0007/+0.0133/+0.0023, MAE +0.0017/+0.0196/+0.0025, nDCG@3 +0.0071/+0.0093/-0.0039 (7
of 9); against item mean + offset AUC -0.0016/+0.0159/+0.0094, MAE
+0.0106/+0.0261/+0.0133, nDCG@3 +0.0034/+0.0050/-0.0030 (7 of 9). ``--ratings-only``:
MAML 0.7471 / 0.7743 / 0.8634, the baseline 0.7436 / 0.7779 / 0.8656, item mean + offset
0.7417 / 0.7831 / 0.8651; MAML wins AUC and MAE on every seed against both and nDCG@3 on
none (6 of 9 against each). Target not reached.

The run before, with MeLU's protocol to the letter (users with more than 100 ratings
dropped from training too; 2026-11-24, 21 minutes; 16-wide context vector, the plain loss
at weight 0.3 beside the meta loss (``meta.plain_loss``), validation under 4 splits of
each user's ratings, ``gmeta tune`` with 2 re-checks per study, each study also
searching its own ridge strength of the output layer, ``meta.ridge`` and
``eval.baseline_ridge``; cold users scored once per seed, mean +- std over seeds):

  row                                  AUC              MAE              nDCG@3
  meta (maml)                          0.7418 +-0.0062  0.7826 +-0.0109  0.8620 +-0.0099
  meta, no adaptation                  0.6621 +-0.0117  0.8733 +-0.0102  0.8552 +-0.0034
  baseline fine-tuned                  0.7430 +-0.0051  0.7853 +-0.0137  0.8566 +-0.0046
  baseline, no fine-tuning             0.6622 +-0.0126  0.8772 +-0.0089  0.8574 +-0.0049
  reference: global mean               0.5000           0.9431 +-0.0051  0.7814 +-0.0099
  reference: item_id mean              0.6710 +-0.0109  0.8638 +-0.0085  0.8512 +-0.0065
  reference: item_id mean + offset     0.7305 +-0.0051  0.8000 +-0.0012  0.8512 +-0.0065

Paired per seed (meta minus other, > 0 better): against the fine-tuned baseline AUC
+0.0035/-0.0048/-0.0025, MAE +0.0018/+0.0092/-0.0029, nDCG@3 +0.0154/+0.0026/-0.0018
(5 of 9; means AUC -0.0013, MAE +0.0027, nDCG@3 +0.0054); against item mean + offset AUC
+0.0072/+0.0048/+0.0220, MAE +0.0059/+0.0155/+0.0309, nDCG@3 +0.0183/+0.0074/+0.0068 (9
of 9), and 9 of 9 against every other reference. Chosen ridge strengths, meta / baseline:
seed 0 1 / 1, seed 1 off (its first trial, the pipeline's own settings) / 3, seed 2 10 /
3. The baseline's settings and figures are those of the run before (the plain loss is
the meta model's alone, and each study's trials are drawn with their own seed).

The 95% intervals of these gaps, ``gmeta eval``'s paired bootstrap over each seed's cold
users (129 / 110 / 123; the same checkpoints scored again after the interval was added to
``gmeta eval``: every figure of the table came out identical, and nothing was chosen on
them), seeds 0 / 1 / 2 (MAE: the other's minus the meta's, > 0: the meta model better):

  against              AUC                       MAE                       nDCG@3
  baseline, seed 0     [-0.0072, +0.0148]        [-0.0099, +0.0141]        [+0.0025, +0.0304]
  baseline, seed 1     [-0.0198, +0.0126]        [-0.0075, +0.0279]        [-0.0125, +0.0178]
  baseline, seed 2     [-0.0062, +0.0008]        [-0.0066, +0.0008]        [-0.0054, +0.0013]

The mean over seeds with its interval (the seeds' cold users are disjoint, so their
standard errors combine as independent): against the baseline AUC -0.0013 [-0.0079,
+0.0054], MAE +0.0027 [-0.0045, +0.0099], nDCG@3 +0.0054 [-0.0016, +0.0124]; against
item mean + offset AUC +0.0113 [+0.0033, +0.0194], MAE +0.0174 [+0.0075, +0.0273],
nDCG@3 +0.0108 [+0.0025, +0.0192]. Against the fine-tuned baseline, 8 of the 9 per-seed
intervals and all three intervals of the mean contain 0: on these users MAML and the
baseline are not told apart, either way. Against item mean + offset, MAML's mean lead is
outside the noise on all three metrics.

The run before, without the plain loss (the same command, 2026-11-24, 25 minutes):

  row                                  AUC              MAE              nDCG@3
  meta (maml)                          0.7389 +-0.0028  0.7816 +-0.0100  0.8575 +-0.0030
  meta, no adaptation                  0.6605 +-0.0149  0.8887 +-0.0235  0.8534 +-0.0043
  (the baseline and references as above)

Paired per seed against the fine-tuned baseline AUC +0.0001/-0.0030/-0.0096, MAE
+0.0026/+0.0127/-0.0044, nDCG@3 +0.0030/-0.0029/+0.0027 (5 of 9; mean AUC -0.0042);
against item mean + offset AUC +0.0037/+0.0067/+0.0149, MAE +0.0067/+0.0190/+0.0294,
nDCG@3 +0.0059/+0.0018/+0.0112 (9 of 9). Chosen strengths, meta / baseline: seed 0 3 /
1, seed 1 100 / 3, seed 2 off / 3. The closed-form output layer helped the baseline more
than the meta model, as it had on validation (README, "The output layer solved on the
support rows"): the baseline's mean cold AUC rose from 0.7372 to 0.7430, MAML's from
0.7378 to 0.7389.

The run before ridge was in the search (the same command, 2026-11-23):

  row                                  AUC              MAE              nDCG@3
  meta (maml)                          0.7378 +-0.0058  0.7869 +-0.0124  0.8590 +-0.0044
  meta, no adaptation                  0.6636 +-0.0175  0.8829 +-0.0273  0.8590 +-0.0067
  baseline fine-tuned (tuned k 4)      0.7372 +-0.0077  0.7876 +-0.0150  0.8572 +-0.0040
  baseline, no fine-tuning             0.6587 +-0.0145  0.8819 +-0.0096  0.8556 +-0.0047
  (references as above)

Paired per seed: against the fine-tuned baseline AUC +0.0076/+0.0013/-0.0069, MAE
+0.0084/-0.0022/-0.0042, nDCG@3 +0.0056/-0.0017/+0.0015; against item mean + offset AUC
+0.0058/+0.0014/+0.0149, MAE +0.0122/-0.0022/+0.0294, nDCG@3 +0.0095/+0.0027/+0.0112.
Ahead on the means of every metric then, not on every seed: the per-seed gaps are the size
of the split-to-split noise of ~120 users (one validation set's AUC moves with sd ~0.01
between splits of the same users' ratings). The paragraphs below are runs without ridge in
the search. Retraining on every warm user (validation users included) for each model's
chosen steps x 1.25, with the settings chosen here, was tried on these seeds and not kept:
MAML's mean cold AUC went from 0.7378 to 0.7366, the baseline's from 0.7372 to 0.7407
(scored on the cold users, as the validation users were in its training set; nothing else
was chosen on it).

Two more seeds (``--seeds 3,4``, cold users 114 / 125): MAML 0.7608/0.7568/0.8642 and
0.7612/0.7615/0.8669 (AUC/MAE/nDCG@3), the fine-tuned baseline 0.7612/0.7642/0.8604 and
0.7368/0.7884/0.8526. Over seeds 0-4 MAML's mean paired lead over the baseline is AUC
+0.0052 (standard error 0.0053), MAE +0.0073 (0.0055), nDCG@3 +0.0047 (0.0027): ahead on
10 of the 15 per-seed comparisons, and on 14 of 15 against item mean + offset.

Since a model whose loss turns non-finite stops alone (the other trains on), seeds 0, 1,
3 and 4, where some meta trials diverged, were run again (``--seeds 0,1,3,4``): four of
the baseline's trials scored higher with their full run (e.g. seed 0's trial 3, 0.6973 ->
0.7299; seed 1's trial 5, 0.6991 -> 0.7286), no choice changed and every cold-user figure
above came out the same. Seed 2 had no diverging trial.

Two more ideas were tried on validation only (``gmeta train`` with the shipped settings
at split seeds 0 / 1 / 2, 2 ranks; no cold user scored) and not kept. Task interpolation
(MLTI, Yao et al. ICLR 2022: in the outer loop every training task replaced by a mix of
its embedded inputs and labels with another task of its batch, one Beta(a, a) weight per
task for its support and query rows alike) gave MAML a best validation AUC of 0.7376 /
0.7524 / 0.7260 with a = 0.5 and 0.7353 / 0.7502 / 0.7234 with a = 2, against 0.7339 /
0.7507 / 0.7273 without it (the baseline's: 0.7206 / 0.7495 / 0.7238). Adapting for more
inner steps in validation and evaluation than the k trained with (``eval.adapt_steps``,
seed 0): 0.7347 with 8 steps, 0.7332 with 12.

With twice the tuning budget (``--trials 16``, 2026-11-24, 35 minutes at ``--jobs 2``) the
mean cold AUC / MAE / nDCG@3 was MAML 0.7372 / 0.7886 / 0.8592 against the fine-tuned
baseline's 0.7367 / 0.7899 / 0.8595; paired per seed 0 / 1 / 2, AUC +0.0056 / -0.0007 /
-0.0036, MAE +0.0034 / -0.0006 / +0.0012, nDCG@3 +0.0062 / -0.0030 / -0.0039: 4 of 9
won, against 5 of 9 at 8 trials. MAML's cold figures changed on seed 0 only (0.7433 ->
0.7413 AUC), the baseline's on seeds 1 and 2 (AUC 0.7285 -> 0.7305, 0.7473 -> 0.7440).

Usage: python -m benchmarks.cold_start [--quick] [--seeds 0,1,2] [--trials 8] [--work DIR]
       [--jobs N] [--np N] [--ratings-only [--ratings FILE] [--split-items N] [--users N]]
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ML100K = ROOT.parent / "shared" / "data" / "ml-100k"
METRICS = ("auc", "mae", "ndcg@3")
META_ROW = "meta"


def _gmeta(*args: str) -> None:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-m", "gmeta_tf.cli", *args], cwd=ROOT, env=env,
                   check=True)


def ratings_only_config(work: Path, ratings: Path | None = None, split_items: int = 1,
                        users: int | None = None) -> Path:
    """``pipelines/movielens.yaml`` as a new user copies it onto a ratings log alone:
    MovieLens 100K's ``u.data`` (user, item, rating, time; no genres, no user features),
    or ``ratings`` (a file of those four columns: tab-separated without a header line as
    ``u.data``, or a CSV whose header line names them, e.g. ``userId,movieId,rating,
    timestamp``), through the ``csv`` source (task = user, label = rating >= 4), the item
    the only feature; every other key as shipped.

    ``split_items`` N > 1 makes items rare, as in a larger catalogue with as many ratings:
    each item becomes N items, a rating going to the one of its user's bucket (a hash of
    the user id), so each has about 1/N of the ratings; ``users`` keeps a seeded sample of
    that many users."""
    source = ratings or ML100K / "u.data"
    with open(source) as f:
        first = f.readline().rstrip("\n")
    delimiter = "," if "," in first and "\t" not in first else "\t"
    cells = first.split(delimiter)
    header = not cells[2].replace(".", "", 1).isdigit()
    columns = cells[:4] if header else ["user_id", "item_id", "rating", "timestamp"]
    if split_items > 1 or users:
        source = _thinned_ratings(source, work, delimiter, header, split_items, users)
    user, item, rating, time_column = columns
    config = yaml.safe_load((ROOT / "pipelines" / "movielens.yaml").read_text())
    config.update(name="ratings_only", run_dir="runs/ratings_only")
    config["export"]["dir"] = "runs/ratings_only/export"
    mapping = {"task": user, "label": rating, "label_threshold": 4, "sparse": [item],
               "order_by": time_column, "delimiter": delimiter, "header": header}
    if not header:
        mapping["columns"] = columns
    config["data"].update(source="csv", raw=str(source), path="runs/ratings_only/data",
                          mapping=mapping)
    model = config["model"]
    model["tables"] = {item: {**model["tables"]["item_id"], "features": [item]}}
    model["item_features"] = [item]
    if model.get("prior"):
        model["prior"] = {**model["prior"], "feature": item}
    model.pop("user_features", None)
    path = work / "ratings_only.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _thinned_ratings(source: Path, work: Path, delimiter: str, header: bool,
                     split_items: int, users: int | None) -> Path:
    """``source`` with a seeded sample of ``users`` users, each item split into
    ``split_items`` items by a hash of the user (see ``ratings_only_config``)."""
    lines = source.read_text().splitlines()
    head, rows = (lines[:1], lines[1:]) if header else ([], lines)
    rows = [r.split(delimiter) for r in rows if r.strip()]
    every_user = sorted({r[0] for r in rows})
    keep = set(every_user if not users or users >= len(every_user) else
               np.random.default_rng(0).choice(every_user, users, replace=False))
    out = head + [delimiter.join([r[0], f"{r[1]}-{zlib.crc32(r[0].encode()) % split_items}",
                                  *r[2:]]) for r in rows if r[0] in keep]
    path = work / f"ratings-split{split_items}-users{users or 'all'}.txt"
    path.write_text("\n".join(out) + "\n")
    return path


def run_seed(seed: int, work: Path, trials: int, quick: bool, config: str,
             raw: Path | None = None, extra: tuple[str, ...] = (), ranks: int = 1) -> dict:
    """tune -> train -> eval of ``config`` at ``seed`` (and ``data.raw`` set to ``raw``;
    ``extra``: more ``--set`` overrides, the same for every seed; ``ranks``: the world
    size of every tuning trial and of the training run, as ``gmeta tune --np`` and
    ``gmeta train --np`` give it)."""
    run_dir = work / f"seed{seed}"
    overrides = [f"run_dir={run_dir}", f"data.path={work / f'data-seed{seed}'}",
                 f"export.dir={run_dir}/export", f"data.seed={seed}", f"model.seed={seed}",
                 f"train.shuffle_seed={seed}"]
    if raw is not None:
        overrides.append(f"data.raw={raw}")
    if quick:
        overrides += ["train.steps=100", "train.eval_every=25"]
    overrides += list(extra)
    sets = [a for o in overrides for a in ("--set", o)]
    timings = {}
    start = time.perf_counter()
    ranks_flag = ("--np", str(ranks)) if ranks > 1 else ()  # one rank: no horovodrun
    _gmeta("tune", "--config", config, "--trials", str(trials), "--seed", str(seed), *ranks_flag,
           *sets)
    timings["tune_s"] = time.perf_counter() - start
    start = time.perf_counter()
    _gmeta("train", "--config", config, "--fresh", *ranks_flag, *sets)
    timings["train_s"] = time.perf_counter() - start
    _gmeta("eval", "--config", config, *sets)
    result = json.loads((run_dir / "eval" / "cold.json").read_text())
    tuned = (run_dir / "tuned.yaml").read_text()
    rows = {_short(r["name"]): {m: r.get(m) for m in (*METRICS, "tasks", "rows")}
            for r in result["rows"]}
    intervals = {_short(p["name"]): p["metrics"] for p in result.get("paired", [])}
    print(f"seed {seed}: {json.dumps(rows)}", flush=True)
    return {"rows": rows, "intervals": intervals, "chosen": result.get("chosen"),
            "tuned": tuned, **timings}


def _short(name: str) -> str:
    """Row names without their settings: 'meta (maml, adapted k=3)' -> 'meta'."""
    if name.startswith("meta ("):
        return META_ROW
    if name.startswith("baseline fine-tuned"):
        return "baseline fine-tuned"
    return name


UNBLENDED = ", not blended with the fold-in"


def complete_rows(runs: list[dict]) -> None:
    """Gives every seed the same rows: ``gmeta eval`` leaves out a model's unblended row
    when its chosen blend is 1 (the same predictions as its blended row), so that seed's
    unblended row is its blended row."""
    names = {n for r in runs for n in r["rows"]}
    for i, r in enumerate(runs):
        for name in sorted(names - set(r["rows"])):
            blended = name.removesuffix(UNBLENDED)
            if blended == name or blended not in r["rows"]:
                raise KeyError(f"run {i} (of the --seeds order) has no row {name!r}")
            r["rows"][name] = r["rows"][blended]


def summarize(runs: list[dict]) -> dict:
    complete_rows(runs)
    names = list(runs[0]["rows"])
    return {n: {m: {"mean": round(float(np.mean([r["rows"][n][m] for r in runs])), 4),
                    "std": round(float(np.std([r["rows"][n][m] for r in runs])), 4)}
                for m in METRICS} for n in names}


def paired(runs: list[dict]) -> dict:
    """The meta model minus every other row, per seed and metric (> 0: meta is better)."""
    out = {}
    for other in runs[0]["rows"]:
        if other == META_ROW:
            continue
        out[other] = {}
        for m in METRICS:
            sign = -1.0 if m == "mae" else 1.0
            diffs = [round(sign * (r["rows"][META_ROW][m] - r["rows"][other][m]), 4)
                     for r in runs]
            intervals = [_interval(r, other, m, sign) for r in runs]
            out[other][m] = {"per_seed": diffs, "mean": round(float(np.mean(diffs)), 4),
                             "better_on_seeds": sum(d > 0 for d in diffs),
                             "interval_per_seed": intervals,
                             "mean_interval": _mean_interval(diffs, intervals)}
    return out


def _mean_interval(diffs: list[float], intervals: list) -> list[float] | None:
    """A 95% interval of the mean gap over seeds: the seeds' cold users are disjoint, so
    their standard errors (each interval's width / 3.92) combine as independent."""
    if not diffs or any(i is None for i in intervals):
        return None
    se = float(np.sqrt(sum(((hi - lo) / 3.92) ** 2 for lo, hi in intervals))) / len(diffs)
    mean = float(np.mean(diffs))
    return [round(mean - 1.96 * se, 4), round(mean + 1.96 * se, 4)]


def _interval(run: dict, other: str, metric: str, sign: float) -> list[float] | None:
    """``gmeta eval``'s 95% paired bootstrap interval of the gap over the seed's cold users,
    in this table's sign (> 0: meta better)."""
    gap = run.get("intervals", {}).get(other, {}).get(metric)
    if not gap or gap["low"] is None:
        return None
    return sorted(round(sign * gap[end], 4) for end in ("low", "high"))


def print_table(table: dict, seeds: list[int]) -> None:
    print(f"\ncold users, mean +- std over seeds {seeds}")
    print(f"{'model':<40}" + "".join(f"{m:>20}" for m in METRICS))
    for name, row in table.items():
        print(f"{name:<40}" + "".join(f"{row[m]['mean']:>12.4f} +-{row[m]['std']:.4f}"
                                      for m in METRICS))


def print_gaps(differences: dict) -> None:
    print("\nmeta minus other (MAE: other minus meta; > 0: meta better): mean over seeds "
          "[95% interval], seeds where meta is better")
    print(f"{'other':<40}" + "".join(f"{m:>34}" for m in METRICS))
    for other, d in differences.items():
        cells = []
        for m in METRICS:
            low_high = d[m]["mean_interval"]
            shown = "" if low_high is None else f" [{low_high[0]:+.4f}, {low_high[1]:+.4f}]"
            seeds = len(d[m]["per_seed"])
            cells.append(f"{d[m]['mean']:+.4f}{shown} {d[m]['better_on_seeds']}/{seeds}")
        print(f"{other:<40}" + "".join(f"{c:>34}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 2 trials, 100 steps")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--trials", type=int, default=8, help="tuning trials per contender")
    parser.add_argument("--work", help="keep datasets and runs here (default: a temporary dir)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once (default 1)")
    parser.add_argument("--np", dest="ranks", type=int, default=1,
                        help="ranks of every tuning trial and training run (gmeta tune/train "
                             "--np; default 1): the world size a user trains at")
    parser.add_argument("--ratings-only", action="store_true",
                        help="u.data alone through gmeta's csv source (item_id the only "
                             "feature), the pipeline otherwise as shipped")
    parser.add_argument("--ratings", type=Path,
                        help="with --ratings-only: this ratings log instead of u.data "
                             "(user, item, rating, time; a TSV without header or a CSV with)")
    parser.add_argument("--split-items", type=int, default=1,
                        help="with --ratings-only: each item split into N by a hash of the "
                             "user (rare items, as in a larger catalogue)")
    parser.add_argument("--users", type=int,
                        help="with --ratings-only: a seeded sample of this many users")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every command of every seed (repeat), "
                             "e.g. model.prior.feature=item_id")
    args = parser.parse_args()
    if not args.ratings_only:
        for flag, given in (("--ratings", args.ratings is not None),
                            ("--split-items", args.split_items != 1),
                            ("--users", args.users is not None)):
            if given:
                parser.error(f"{flag} reshapes the ratings-only run; add --ratings-only")
    if args.ranks < 1:
        parser.error(f"--np {args.ranks}: expected a number of ranks >= 1")
    if not ML100K.is_dir():
        raise SystemExit(f"MovieLens 100K not found at {ML100K}")
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    trials = 2 if args.quick else args.trials
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        # The ratings-only config names its raw file; the shipped pipeline reads ML100K.
        config, raw = ((str(ratings_only_config(work, args.ratings, args.split_items,
                                                args.users)), None)
                       if args.ratings_only else ("movielens", ML100K))
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            runs = list(pool.map(lambda s: run_seed(s, work, trials, args.quick, config, raw,
                                                  tuple(args.sets), args.ranks),
                                 seeds))
    table = summarize(runs)
    print_table(table, seeds)
    differences = paired(runs)
    print_gaps(differences)
    wins = {other: all(d[m]["better_on_seeds"] == len(seeds) for m in METRICS)
            for other, d in differences.items()}
    print(json.dumps({"benchmark": "cold_start",
                      "dataset": _dataset_name(args),
                      "seeds": seeds, "ranks": args.ranks,
                      "trials_per_contender": trials, "scored": "cold users, once per seed",
                      "table": table, "paired_meta_minus_other": differences,
                      "meta_better_on_every_seed_and_metric": wins, "runs": runs,
                      "reference_melu_ml1m": {"melu5_mae": 0.785, "wide_deep_mae": 1.069}}))


def _dataset_name(args) -> str:
    if not args.ratings_only:
        return "ml-100k"
    name = f"{args.ratings or 'ml-100k u.data'} alone"
    if args.split_items > 1:
        name += f", each item split in {args.split_items} by user"
    return name + (f", {args.users} users" if args.users else "")


if __name__ == "__main__":
    main()
