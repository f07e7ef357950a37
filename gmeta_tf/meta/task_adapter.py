"""TaskAdapter: the inner loop, k SGD steps on the support sets of T tasks at once."""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import tensorflow as tf

from gmeta_tf.meta.task_batch import RoleBatch, role_batches
from gmeta_tf.models.heads import Head
from gmeta_tf.models.label_prior import PRIOR_FACTORS, PRIOR_INPUT
from gmeta_tf.models.tower import Tower

EMBEDDING_PREFIX = "embedding/"
#: The smallest ridge strength used (learned strengths may fall below it): the solve stays
#: well posed when a hidden unit is zero on every support row of a task.
MIN_RIDGE = 1e-2


def ridge_size(tower: Tower) -> int:
    """How many ridge strengths the tower's output layer takes: its kernel's rows and its
    bias.

    Raises:
        ValueError: The tower has no output layer over a hidden layer.
    """
    if tower.output_layer is None:
        raise ValueError(f"ridge adaptation needs a tower with an output layer; {tower.name} "
                         f"has none")
    return tower.params()[tower.output_layer[0]].shape[0] + 1


def initial_ridge(tower: Tower, ridge: float) -> Callable[[], tf.Tensor]:
    """The ridge strengths ``[ridge_size]`` a model's solve starts from (the baseline's,
    which it keeps): ``ridge`` for each weight on the last hidden layer and, under a label
    prior with factors (read by the output layer's last rows, ``MeLUTower.hidden``), the
    prior's fold-in strengths (``LabelPrior.fold_in_strengths``) for each weight on a factor
    and for the bias, so that with the hidden weights held the solve is the
    factorisation's own fold-in of the task."""
    size = ridge_size(tower)
    factors = (tower.prior.factors if tower.prior is not None and tower.prior.factors_in_output
               else 0)
    if not factors:
        return lambda: tf.fill([size], float(ridge))
    return lambda: tf.concat([tf.fill([size - 1 - factors], float(ridge)),
                              tower.prior.fold_in_strengths()], axis=0)


def ridge_fit(z: tf.Tensor, residual: tf.Tensor, mask: tf.Tensor,
              strengths: tf.Tensor) -> tf.Tensor:
    """Every task's ridge fit ``[T, d]`` of ``residual [T, S]`` on ``z [T, S, d]`` over its
    real rows (``mask [T, S]``): ``(sum z z' + diag(strengths))^-1 sum z residual``, the
    strengths ``[d]`` floored at ``MIN_RIDGE``."""
    # Solved in float64: the Gram matrix of ~50 rows and the smallest learned strengths
    # can be too ill-conditioned for a float32 Cholesky factor.
    z64 = tf.cast(z, tf.float64)
    masked = z64 * tf.cast(mask, tf.float64)[..., None]
    strengths = tf.maximum(tf.cast(strengths, tf.float64), MIN_RIDGE)
    gram = tf.matmul(masked, z64, transpose_a=True) + tf.linalg.diag(strengths)
    rhs = tf.linalg.matvec(masked, tf.cast(residual, tf.float64), transpose_a=True)
    return tf.cast(tf.linalg.cholesky_solve(tf.linalg.cholesky(gram), rhs[..., None])[..., 0],
                   tf.float32)


def fold_in_outputs(tower: Tower, head: Head, support: RoleBatch, query: RoleBatch
                    ) -> tf.Tensor:
    """The label prior's factorisation alone, each task folded in on its support rows
    (``references.FactorModel.fold_in`` with the head's offset as the mean): raw outputs
    ``[T, Q]``, the item's prior plus ``q_item . p_task + b_task``, where ``(p_task,
    b_task)`` is the ridge fit of the support ratings less the offset and the items' priors
    at the prior's fold-in strength. Reads only the prior's inputs (``raw_inputs``).

    Raises:
        ValueError: The tower has no label prior with factors.
    """
    prior = tower.prior
    if prior is None or not prior.factors:
        raise ValueError(f"{tower.name}: the fold-in needs a label prior with factors")

    def with_one(role):
        q = role.inputs[PRIOR_FACTORS]
        return tf.concat([q, tf.ones_like(q[..., :1])], axis=-1)                # [T, N, F+1]

    residual = tf.cast(support.labels, tf.float32) - head.offset - support.inputs[PRIOR_INPUT]
    strengths = prior.fold_in_strengths()
    fitted = ridge_fit(with_one(support), residual, support.mask, strengths)    # [T, F+1]
    return query.inputs[PRIOR_INPUT] + tf.linalg.matvec(with_one(query), fitted)


def resolve_fast_weights(tower: Tower, selectors: Sequence[str]) -> tuple[str, ...]:
    """Tower parameter names selected by names or name prefixes (empty: all of them).

    Raises:
        ValueError: A selector matches no parameter of the tower.
    """
    names = tuple(tower.params())
    if not selectors:
        return names
    chosen = []
    for sel in selectors:
        hits = [n for n in names if n == sel or n.startswith(sel.rstrip("/") + "/")]
        if not hits:
            raise ValueError(f"fast_weights selector {sel!r} matches no weight of "
                             f"{tower.name}; its weights are {list(names)}")
        chosen.extend(h for h in hits if h not in chosen)
    return tuple(n for n in names if n in chosen)


class Adaptation(NamedTuple):
    """What ``TaskAdapter.adapt`` gives.

    Attributes:
        fast: The adapted fast weights.
        before: Each task's support loss before the steps ``[T]`` (None without steps).
        after: Each task's support loss under ``fast`` ``[T]`` where the inner loop has
            computed it anyway (backtracking checks the last step; without a ridge solve
            after it, that loss is the adapted weights'), else None.
    """

    fast: dict
    before: tf.Tensor | None
    after: tf.Tensor | None = None


class TaskAdapter:
    """Adapts fast weights to each task's support set, for T tasks in one batched loop.

    Fast weights are a dict of tensors: every adapted tower weight with a leading task
    axis ``[T, ...]`` (its copies start equal to the slow weight) and, for every adapted
    embedding feature ``f``, ``"embedding/f"``: a ``[P, dim]`` offset per distinct
    (task, id) pair, starting at zero. The loop contains no Python loop over tasks: the
    tasks' losses are summed, so the gradient w.r.t. task ``t``'s copy is task ``t``'s own.

    Args:
        tower: The tower.
        head: The head (loss).
        fast_weights: Adapted tower weight names (see ``resolve_fast_weights``).
        adapted_embeddings: Single-valued sparse features whose per-task rows adapt.
        steps: Inner SGD steps k.
        ridge: With a rating head, a function giving the ridge strengths ``[width + 1]``
            (the output kernel's, then its bias'): after the k steps the output layer is
            solved in closed form on the support rows (``solve_output_layer``). None: off.
        backtrack: A step that raises a task's support loss is taken back and that task's
            steps are halved from then on (a backtracking line search per task, first-order
            adaptation only): plain fine-tuning at one hand-set rate then never leaves a
            task worse on its own support rows than it found it.
    """

    def __init__(self, tower: Tower, head: Head, fast_weights: Sequence[str],
                 adapted_embeddings: Sequence[str], steps: int,
                 ridge: Callable[[], tf.Tensor] | None = None, backtrack: bool = False) -> None:
        unknown = [f for f in adapted_embeddings if f not in tower.sparse_features]
        if unknown:
            raise ValueError(f"adapt_embeddings {unknown} are not sparse features of "
                             f"{tower.name}: {list(tower.sparse_features)}")
        if ridge is not None and (head.kind != "rating" or tower.output_layer is None):
            raise ValueError(f"ridge adaptation needs a rating head (squared error) and a tower "
                             f"with an output layer; got {head!r} and {tower.name}")
        self.tower, self.head, self.steps, self.ridge = tower, head, steps, ridge
        self.backtrack = backtrack
        self.tower_fast = tuple(fast_weights)
        self.embedding_fast = tuple(EMBEDDING_PREFIX + f for f in adapted_embeddings)

    @property
    def fast_names(self) -> tuple[str, ...]:
        """Names of every fast weight: tower weights then embedding offsets."""
        return self.tower_fast + self.embedding_fast

    def initial(self, params: Mapping[str, tf.Tensor], num_tasks: tf.Tensor,
                num_pairs: Mapping[str, tf.Tensor]) -> dict:
        """Fast weights before adaptation: T copies of the slow weights, zero offsets."""
        fast = {}
        for n in self.tower_fast:
            w = params[n]
            fast[n] = tf.broadcast_to(w, tf.concat([[num_tasks], tf.shape(w)], axis=0))
        for n in self.embedding_fast:
            fast[n] = tf.zeros([num_pairs[n[len(EMBEDDING_PREFIX):]], self.tower.input_width])
        return fast

    def _inputs(self, fast: Mapping[str, tf.Tensor], role: RoleBatch) -> dict:
        inputs = dict(role.inputs)
        for n in self.embedding_fast:
            feature = n[len(EMBEDDING_PREFIX):]
            inputs[feature] = inputs[feature] + tf.gather(fast[n], role.pairs[feature])
        return inputs

    @staticmethod
    def _weights(params: Mapping[str, tf.Tensor], fast: Mapping[str, tf.Tensor]) -> dict:
        return {**params, **{n: w for n, w in fast.items() if not n.startswith(EMBEDDING_PREFIX)}}

    def outputs(self, params: Mapping[str, tf.Tensor], fast: Mapping[str, tf.Tensor],
                role: RoleBatch) -> tf.Tensor:
        """The tower's raw outputs ``[T, N]`` under the slow weights replaced by ``fast``."""
        return self.tower.apply(self._weights(params, fast), self._inputs(fast, role))

    def solve_output_layer(self, params: Mapping[str, tf.Tensor], fast: Mapping[str, tf.Tensor],
                           support: RoleBatch) -> dict:
        """Every task's output layer as the ridge fit of its support ratings.

        With ``h`` the last hidden layer under the fast weights (plus a 1 for the bias),
        ``w0`` the slow output layer, ``l`` the tower's linear term and ``L`` the diagonal
        of strengths, the task's layer is ``w0 + (sum h h' + L)^-1 sum h (y - offset - l -
        h'w0)`` over its real support rows:
        the minimiser of its summed squared error plus ``sum L (w - w0)^2`` (strengths below
        ``MIN_RIDGE`` count as it). Differentiable in ``h``, ``w0`` and ``L`` (the outer
        loop learns through it).
        """
        kernel, bias = self.tower.output_layer
        h = self.tower.hidden(self._weights(params, fast), self._inputs(fast, support))
        z = tf.concat([h, tf.ones_like(h[..., :1])], axis=-1)                  # [T, S, d+1]
        prior = tf.concat([tf.reshape(params[kernel], [-1]), tf.reshape(params[bias], [-1])], 0)
        residual = (tf.cast(support.labels, tf.float32) - self.head.offset
                    - tf.linalg.matvec(z, prior))                              # [T, S]
        linear = self.tower.linear_term(params, self._inputs(fast, support))
        if linear is not None:  # the first-order term beside the output layer stays as is
            residual -= linear
        layer = prior + ridge_fit(z, residual, support.mask, self.ridge())     # [T, d+1]
        return {**fast, kernel: layer[:, :-1, None], bias: layer[:, -1:]}

    def _pair_tasks(self, fast: Mapping[str, tf.Tensor], support: RoleBatch) -> dict:
        """Each adapted embedding offset's (task, id) pairs' task, ``[P]`` per name (a pair
        read by no support row has no gradient: any task will do, here task 0)."""
        out = {}
        for n in self.embedding_fast:
            pairs = support.pairs[n[len(EMBEDDING_PREFIX):]]                     # [T, S]
            tasks = tf.broadcast_to(tf.range(tf.shape(pairs)[0])[:, None], tf.shape(pairs))
            out[n] = tf.maximum(tf.math.unsorted_segment_max(
                tf.reshape(tasks, [-1]), tf.reshape(pairs, [-1]), tf.shape(fast[n])[0]), 0)
        return out

    @staticmethod
    def _per_task(values: tf.Tensor, name: str, weight: tf.Tensor,
                  pair_tasks: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Per-task ``values [T]`` shaped to broadcast against fast weight ``name``: over
        its task axis, or for an embedding offset ``[P, dim]`` over each pair's task
        (``_pair_tasks``)."""
        if name in pair_tasks:
            return tf.gather(values, pair_tasks[name])[:, None]
        return tf.reshape(values, tf.concat([tf.shape(values), tf.ones(
            [tf.rank(weight) - 1], tf.int32)], 0))

    def _back_off(self, fast: dict, losses: tf.Tensor, grads: list, scale: tf.Tensor,
                  accepted: tuple, pair_tasks: Mapping[str, tf.Tensor]
                  ) -> tuple[dict, tf.Tensor, list, tf.Tensor]:
        """Takes back the last step of every task whose support loss it raised (or made
        not finite): its fast weights, loss and gradient return to its last accepted point
        and its step scale halves."""
        good_fast, good_losses, good_grads = accepted
        rose = ~(losses <= good_losses)                                          # [T]
        out = {n: tf.where(self._per_task(rose, n, w, pair_tasks), good_fast[n], w)
               for n, w in fast.items()}
        grads = [tf.where(self._per_task(rose, n, g, pair_tasks), gg, g)
                 for n, g, gg in zip(fast, grads, good_grads)]
        return (out, tf.where(rose, good_losses, losses), grads,
                tf.where(rose, 0.5 * scale, scale))

    def task_losses(self, params: Mapping[str, tf.Tensor], fast: Mapping[str, tf.Tensor],
                    role: RoleBatch) -> tf.Tensor:
        """Each task's mean loss over its real rows, ``[T]``."""
        return self.head.masked_loss(role.labels, self.outputs(params, fast, role), role.mask)

    def adapt(self, params: Mapping[str, tf.Tensor], fast: Mapping[str, tf.Tensor],
              support: RoleBatch, learning_rates: Mapping[str, tf.Tensor],
              first_order: bool, rates_per_step: bool = False,
              trajectory: list | None = None, grad_dropout: float = 0.0) -> Adaptation:
        """k SGD steps of every task's fast weights on its support loss.

        Under an enclosing ``GradientTape`` the inner gradients are recorded, so the outer
        gradient is the full second-order one, unless ``first_order`` makes them constants.
        With ``rates_per_step`` every rate has a leading step axis and step ``i`` uses its
        row ``i`` (MAML++'s per-step rates); steps beyond that axis reuse its last row.
        A ``trajectory`` list receives the fast weights after every step. With ``ridge``
        the output layer is then solved in closed form (after the last step, and in every
        trajectory entry). With ``grad_dropout`` p > 0 (training only) every element of
        every inner gradient is kept with probability 1 - p and scaled by 1 / (1 - p), a
        fresh draw at every step (``dropped_gradient``).

        Returns:
            An ``Adaptation``: the adapted fast weights and each task's support loss
            before the steps (and after them, where the loop computed it).
        """
        if self.backtrack and not first_order:
            raise ValueError("backtracking adapts first-order only (evaluation and serving)")
        fast = dict(fast)
        initial_losses = None
        scale = accepted = None  # backtracking: each task's step scale [T], its last good point
        pair_tasks = self._pair_tasks(fast, support) if self.backtrack else {}
        for step in range(self.steps):
            names = list(fast)
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch([fast[n] for n in names])
                losses = self.task_losses(params, fast, support)
                total = tf.reduce_sum(losses)
            if initial_losses is None:
                initial_losses = losses
            grads = tape.gradient(total, [fast[n] for n in names],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            grads = [tf.convert_to_tensor(g) for g in grads]
            if self.backtrack:
                if accepted is None:
                    scale = tf.ones_like(losses)
                else:
                    fast, losses, grads, scale = self._back_off(fast, losses, grads, scale,
                                                                accepted, pair_tasks)
                accepted = (dict(fast), losses, grads)
            for n, g in zip(names, grads):
                if grad_dropout:
                    g = dropped_gradient(g, grad_dropout)
                if first_order:
                    g = tf.stop_gradient(g)
                rate = learning_rates[n]
                if rates_per_step:
                    rate = rate[min(step, rate.shape[0] - 1)]
                if scale is not None:
                    rate = rate * self._per_task(scale, n, fast[n], pair_tasks)
                fast[n] = fast[n] - rate * g
            if trajectory is not None:
                trajectory.append(dict(fast))
        final_losses = None
        if self.backtrack and self.steps:  # the last step is checked too
            fast, final_losses, *_ = self._back_off(
                fast, self.task_losses(params, fast, support), grads, scale, accepted,
                pair_tasks)
        if self.ridge is not None and self.steps:
            final_losses = None  # the solve below moves the output layer
            if trajectory is None:
                fast = self.solve_output_layer(params, fast, support)
            else:  # its last entry is the last step's fast weights: solved once, for both
                trajectory[:] = [self.solve_output_layer(params, f, support) for f in trajectory]
                fast = trajectory[-1]
        return Adaptation(fast, initial_losses, final_losses)


def dropped_gradient(grad: tf.Tensor, rate: float) -> tf.Tensor:
    """DropGrad (Tseng et al., "Regularizing Meta-Learning via Gradient Dropout", ACCV
    2020): ``grad`` with each element zeroed with probability ``rate`` and the rest scaled
    by ``1 / (1 - rate)``, so its expectation is ``grad``. The mask is a constant: the
    outer gradient flows through the kept elements."""
    keep = tf.cast(tf.random.uniform(tf.shape(grad)) >= rate, grad.dtype)
    return grad * keep / (1.0 - rate)


#: A task's adaptation has diverged when it leaves the task's own support loss more than
#: this many times what it was before the steps (a blow-up; a meta-learned step may raise
#: it a little, and is kept).
DIVERGED_LOSS_RATIO = 2.0


class AdaptedQuery(NamedTuple):
    """What adapting a batch of tasks gives, from one pass of the inner loop.

    Attributes:
        blended: Raw outputs ``[T, Q]`` on the query rows, blended with the prior's
            fold-in where the tower has a blend (else the adapted outputs).
        unblended: The adapted outputs alone, ``[T, Q]``.
        kept: ``[T]`` bool: False where the task's adaptation diverged and was undone
            (its rows in both outputs are then the unadapted ones).
    """

    blended: tf.Tensor
    unblended: tf.Tensor
    kept: tf.Tensor


def adapted_query(embedding: tf.keras.layers.Layer, adapter: TaskAdapter,
                  batch: Mapping[str, Mapping[str, tf.Tensor]],
                  learning_rates: Mapping[str, tf.Tensor],
                  rates_per_step: bool = False) -> AdaptedQuery:
    """The query rows' outputs after adapting on the support rows, blended and not, and
    which tasks' adaptation was kept: one embedding call and one inner loop for all three.

    Evaluation and serving: embeddings are read without inserting (unknown ids read zero
    rows), the adaptation is first-order (no outer gradient) and nothing is updated.
    Under a label prior with factors, an adapted tower's outputs are blended with the
    factorisation's own fold-in (``fold_in_outputs``) at the tower's weight ``b``
    (``Tower.prior_blend``, chosen on validation): ``b * adapted + (1 - b) * fold-in``.
    Without steps (no adaptation) the support rows are not read and nothing is blended.

    A task whose adaptation diverged gets its unadapted outputs instead: one whose support
    loss after the steps is more than ``DIVERGED_LOSS_RATIO`` times what it was before
    them or not finite, or one of whose outputs is not finite (e.g. fine-tuning at a rate
    chosen on validation users that blows up on a user unlike them), so no task is scored
    or served a NaN or a blown-up score; every other task's outputs are unchanged. The
    unadapted outputs are computed only when some task of the batch was undone (a
    ``tf.cond``; the tower is applied to rows already embedded, so no rank waits on a
    collective the others skip).
    """
    adapted_embeddings = [n[len(EMBEDDING_PREFIX):] for n in adapter.embedding_fast]
    support, query, num_pairs = role_batches(embedding, adapter.tower, adapter.head.label, batch,
                                             False, adapted_embeddings)
    params = adapter.tower.params()
    fast = adapter.initial(params, tf.shape(support.mask)[0], num_pairs)
    adaptation = adapter.adapt(params, fast, support, learning_rates, first_order=True,
                               rates_per_step=rates_per_step)
    adapted, before = adaptation.fast, adaptation.before
    outputs = adapter.outputs(params, adapted, query)
    if not adapter.steps:
        return AdaptedQuery(outputs, outputs, tf.ones_like(outputs[:, 0], tf.bool))
    blended = outputs
    blend = adapter.tower.prior_blend
    if blend is not None:
        blended = blend * outputs + (1.0 - blend) * fold_in_outputs(adapter.tower, adapter.head,
                                                                     support, query)
    after = adaptation.after
    if after is None:
        after = adapter.task_losses(params, adapted, support)
    kept = (tf.math.is_finite(after) & (after <= DIVERGED_LOSS_RATIO * before)
            & tf.reduce_all(tf.math.is_finite(outputs), axis=-1)
            & tf.reduce_all(tf.math.is_finite(blended), axis=-1))                 # [T]

    def undone():
        unadapted = adapter.outputs(params, fast, query)
        return (tf.where(kept[:, None], blended, unadapted),
                tf.where(kept[:, None], outputs, unadapted))

    blended, outputs = tf.cond(tf.reduce_all(kept), lambda: (blended, outputs), undone)
    return AdaptedQuery(blended, outputs, kept)


def adapted_outputs(embedding: tf.keras.layers.Layer, adapter: TaskAdapter,
                    batch: Mapping[str, Mapping[str, tf.Tensor]],
                    learning_rates: Mapping[str, tf.Tensor],
                    rates_per_step: bool = False, blended: bool = True) -> tf.Tensor:
    """Raw outputs ``[T, Q]`` on the query rows after adapting on the support rows
    (``adapted_query``): blended with the prior's fold-in where the tower has a blend,
    or with ``blended=False`` the adapted outputs alone."""
    query = adapted_query(embedding, adapter, batch, learning_rates, rates_per_step)
    return query.blended if blended else query.unblended
