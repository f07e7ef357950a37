"""MetaConfig: the knobs of the two update loops."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from gmeta_tf import config_fields
from gmeta_tf.config_fields import FieldError

Algorithm = Literal["maml", "fomaml", "reptile"]
ALGORITHMS = typing.get_args(Algorithm)


@dataclasses.dataclass(frozen=True)
class MetaConfig:
    """How the inner and outer loops run.

    Args:
        algorithm: "maml" (full second-order meta-gradient), "fomaml" (first-order: the
            inner gradients are constants in the outer gradient) or "reptile" (the dense
            slow weights move toward the mean adapted weights; the outer optimizer's
            learning rate is Reptile's step size).
        inner_steps: k, SGD steps on each task's support set.
        inner_lr: The inner learning rate (the initial one when learned).
        learn_inner_lr: Meta-SGD: learn the inner learning rates in the outer loop, one per
            adapted weight tensor (or per element, see ``inner_lr_per_element``). Under
            Reptile the rates follow the first-order query gradient while the dense
            weights follow Reptile's update, which does not see the query loss: a mix that
            can drive the rates to zero or diverge (benchmarks/cold_start.py).
        fast_weights: Tower parameter names adapted in the inner loop, or prefixes of them
            ("mlp", "top"); empty means all of the tower's weights.
        adapt_embeddings: Also adapt, per task, the embedding rows of the task's own ids of
            these single-valued features (e.g. ("item_id",)); the adapted rows are
            discarded after the step, the table changes only in the outer loop.
        inner_lr_per_element: With ``learn_inner_lr``, one learned rate per element of
            every adapted weight (Meta-SGD as Li et al. 2017 define it; for an adapted
            embedding feature, one per embedding column) instead of one per tensor.
        inner_lr_per_step: With ``learn_inner_lr``, a separate learned rate (per tensor or
            per element) for each of the k inner steps (MAML++'s per-step rates, Antoniou
            et al. 2019); adapting for more than k steps reuses the last step's rates.
        multi_step_loss: MAML++'s multi-step loss: for the first this many outer steps the
            outer loss is a weighted sum of the query losses after each inner step, the
            weights moving linearly from equal (1/k each) to the last step's alone; after
            that, the plain query loss after step k. 0: off. MAML and first-order MAML.
        ridge: After the k inner steps, set the tower's output layer to the closed-form
            ridge regression fit of the task's support rows on the adapted last hidden
            layer, shrunk toward the slow output layer with strength ``ridge`` per weight
            (the weights on a factor prior's factors and the bias at its fold-in strength
            instead, ``task_adapter.initial_ridge``; the meta model learns one strength
            per weight from this start; the baseline, fine-tuned the same way, keeps
            ``eval.baseline_ridge``). The exact minimiser
            of the support loss plus the penalty, where k SGD steps only approach it
            (R2-D2, Bertinetto et al. ICLR 2019). A rating head (squared error) only. 0: off.
        ridge_lr: The outer learning rate of the learned strengths' logs (None: the outer
            rate, ``train.learning_rate``, as every other weight). The outer rate that suits
            the tower moves a log by at most about 0.001 a step, so the strengths would end
            near where they started; the default lets each move by about 0.02 a step.
        plain_loss: Weight of the plain objective in the outer loss: the unadapted loss on
            every row of the batch's tasks (what the baseline trains, and
            ``train.pretrain_steps`` trains alone) is added to the query loss after
            adaptation, times this weight, at every meta step. The embedding rows of a
            task's support items then learn from their own ratings directly, not only
            through the inner loop, and the slow weights stay a good model before any
            adaptation. MAML and first-order MAML. 0: off.
        within_task_loss: Weight of each task's within-task squared error, added to both
            models' training losses: the meta model's query loss after adaptation and the
            baseline's loss on its rows (the same weight, so the two keep the same
            objective). A task's predictions and labels are each centred on their mean
            over the task's rows, so only the order and spacing of its rows count, not its
            level: what a ranking of one user's items (nDCG) is scored on. Squared error
            is the user's level error squared plus this within-task error, so W > 0
            weighs the latter 1 + W times. A rating head only. 0: off.
        label_shift: Meta-augmentation (Rajendran et al. NeurIPS 2020): in training, every
            task's ratings, its support and query rows alike, are shifted by one offset
            drawn uniformly from [-label_shift, label_shift] for that task at that step, so
            that no weight can learn a training user's level from anything but the
            support rows (user features such as a zip code identify a user as well as
            an id would). Evaluation and serving see the labels as they are. A rating
            head only. 0: off.
        grad_dropout: DropGrad (Tseng et al. ACCV 2020), against meta-over-fitting: in
            training, each element of every inner-loop gradient is dropped with this
            probability and the rest scaled by 1 / (1 - p), a fresh draw at every step
            of every task, so the slow weights cannot rely on one exact path of
            adaptation. Evaluation and serving adapt on the whole gradient. 0: off.
        task_interpolation: MLTI (Yao, Zhang and Finn, ICLR 2022), against meta-over-fitting
            when training tasks are few: in training, each task of a step is, with this
            probability, replaced by its interpolation with another task of the step (one
            drawn at random): each of its support and query rows' tower inputs (embedded
            rows, dense features, prior) and labels become ``lam`` times its own plus
            ``1 - lam`` times the other task's row of the same rank in its role (cycling
            through the other's rows when it has fewer), ``lam ~ Beta(0.5, 0.5)``, one draw
            per task, the same for its support and query rows. The task keeps its own
            mask. With ``adapt_embeddings``, a task's adapted rows are added to its mixed
            rows' inputs as to its own (not measured). Evaluation and serving see tasks as
            they are. 0: off.
    """

    algorithm: Algorithm = "maml"
    inner_steps: int = config_fields.field(1, min=1)
    inner_lr: float = config_fields.field(0.01, min_exclusive=0.0)
    learn_inner_lr: bool = False
    fast_weights: tuple[str, ...] = ()
    adapt_embeddings: tuple[str, ...] = ()
    inner_lr_per_element: bool = False
    inner_lr_per_step: bool = False
    multi_step_loss: int = config_fields.field(0, min=0)
    ridge: float = config_fields.field(0.0, min=0.0)
    ridge_lr: float | None = config_fields.field(0.02, min_exclusive=0.0)
    plain_loss: float = config_fields.field(0.0, min=0.0)
    within_task_loss: float = config_fields.field(0.0, min=0.0)
    label_shift: float = config_fields.field(0.0, min=0.0)
    grad_dropout: float = config_fields.field(0.0, min=0.0, max=0.9)
    task_interpolation: float = config_fields.field(0.0, min=0.0, max=1.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast_weights", _names(self.fast_weights))
        object.__setattr__(self, "adapt_embeddings", _names(self.adapt_embeddings))
        config_fields.check(self)
        if self.algorithm == "reptile":
            outer = "its dense update does not follow the outer loss"
            for key, what, why in (
                    ("multi_step_loss", "the multi-step loss", outer),
                    ("plain_loss", "the plain loss", outer),
                    ("within_task_loss", "the within-task loss", outer),
                    ("label_shift", "the label shift",
                     "its dense update would see the shift only through the support rows it "
                     "adapts on, and the shift was measured only against the query loss")):
                if getattr(self, key):
                    raise FieldError(type(self).__name__, key, getattr(self, key),
                                     f"0 with algorithm 'reptile' ({why}; {what} is for "
                                     f"maml and fomaml)")

    @property
    def first_order(self) -> bool:
        """True when the outer gradient treats the inner gradients as constants."""
        return self.algorithm != "maml"


def _names(value):
    """A list of names as a tuple (a lone string stays as it is, for check to refuse)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value
