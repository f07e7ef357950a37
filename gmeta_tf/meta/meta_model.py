"""MetaModel: MAML, first-order MAML and Reptile over hash embeddings, as a Keras model."""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.meta.meta_config import MetaConfig
from gmeta_tf.meta.task_adapter import (AdaptedQuery, TaskAdapter, adapted_query,
                                        resolve_fast_weights, ridge_size)
from gmeta_tf.meta.task_batch import RoleBatch, role_batches
from gmeta_tf.models.embedding_inputs import dropped_embeddings, embedding_penalty
from gmeta_tf.models.heads import Head
from gmeta_tf.models.tower import Tower

TaskBatch = Mapping[str, Mapping[str, tf.Tensor]]


class MetaModel(tf.keras.Model):
    """Optimization-based meta-learning of a recommendation model (G-Meta's meta step).

    One ``train_step`` on a batch of T tasks (Meta-IO layout, see ``gmeta_tf.data``):

    1. the sparse ids of every support and query row of the batch go through ONE call of
       the embedding layer: the ids are deduplicated once, then two all-to-alls go
       forward (unique ids to their owners, their rows back), whatever k and T;
    2. inner loop (``TaskAdapter``): k SGD steps on each task's support loss adapt the fast
       weights (by default the whole tower; optionally the task's own embedding rows), for
       all T tasks at once with a leading task axis, without communication;
    3. outer loop: the mean query loss under the adapted weights (plus, with
       ``MetaConfig.plain_loss``, that weight times the unadapted loss on every row of the
       batch's tasks, and with ``MetaConfig.within_task_loss``, that weight times each
       task's adapted query error centred on its mean), differentiated ONCE w.r.t. the
       dense slow weights, the learned inner rates and the embedding's update trigger.
       The trigger's gradient sends the embedding row gradients back in ONE all-to-all and
       applies the fused sparse optimizer on their owners; the dense gradients are
       all-reduced (``distributed.allreduce_gradients``) and applied by the compiled Keras
       optimizer. MAML keeps the second-order terms (the inner gradients are recorded by
       the outer tape), first-order MAML drops them, Reptile moves the adapted dense slow
       weights toward the tasks' mean adapted weights (gradient ``theta - mean(theta')``)
       while everything else follows the first-order query gradient.

    Args:
        embedding: Layer mapping ``{name: ids}`` to ``{name: [n, dim]}`` in one call
            (``gmeta_tf.embedding.ShardedHashEmbedding``), trained through its
            ``trainable_variables`` (the fused update trigger).
        tower: The dense tower (``MeLUTower``, ``DLRMTower``).
        head: The head; its ``label`` names the label feature of the batch.
        config: The loops' settings.
        embedding_l2: In training, this weight times the mean squared norm of the embedding
            rows of every real support and query row is added to the outer objective (and
            to pre-training's; ``embedding_penalty``; 0: none).
        embedding_dropout: In training (meta-training and pre-training), the embedded rows
            the tower reads, support and query alike, are dropped out at this rate, one
            draw per step shared by the inner and outer loops (``dropped_embeddings``; the
            penalty reads them whole; 0: none).

    Example::

        model = MetaModel(embedding, MeLUTower(items, users, 16), RatingHead("rating", 3.5),
                          MetaConfig("maml", inner_steps=5, inner_lr=5e-3))
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3))
        model.fit(data.read_tasks(path, 32, 20, 10), epochs=10)
        scores = model.adapted_predictions(cold_batch)    # [T, Q]
    """

    def __init__(self, embedding: tf.keras.layers.Layer, tower: Tower, head: Head,
                 config: MetaConfig | None = None, embedding_l2: float = 0.0,
                 ridge_scale: float = 1.0, embedding_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.embedding, self.tower, self.head = embedding, tower, head
        self.embedding_l2 = float(embedding_l2)
        self.embedding_dropout = float(embedding_dropout)
        self.config = config or MetaConfig()
        if not ridge_scale > 0:
            raise ValueError(f"ridge_scale={ridge_scale!r}, expected a number > 0")
        fast = resolve_fast_weights(tower, self.config.fast_weights)
        self.ridge_variable = self._create_ridge(float(ridge_scale))
        self.adapter = TaskAdapter(tower, head, fast, self.config.adapt_embeddings,
                                   self.config.inner_steps, self.ridge_strengths)
        self.inner_lr_variables = self._create_inner_rates()
        # Outer-optimizer steps spent pre-training (the trainer sets it from
        # train.pretrain_steps): the multi-step loss anneals over meta steps only.
        self.pretrained_steps = 0

    def _create_ridge(self, scale: float) -> tf.Variable | None:
        """The learned ridge strengths (``MetaConfig.ridge``), one per weight of the output
        layer, or None: their logs over ``scale`` (see ``ridge_strengths``), with the scale
        beside them (``ridge_scale_variable``, not trained; a restored checkpoint's scale
        replaces it, so it is kept nowhere else)."""
        self.ridge_scale_variable = None
        if not self.config.ridge:
            return None
        self.ridge_scale_variable = self.add_weight(
            name="ridge/scale", shape=[], trainable=False,
            initializer=tf.keras.initializers.Constant(scale))
        return self.add_weight(name="ridge/scaled_log_strength", shape=[ridge_size(self.tower)],
                               trainable=True,
                               initializer=tf.keras.initializers.Constant(
                                   math.log(self.config.ridge) / scale))

    @property
    def ridge_variables(self) -> list[tf.Variable]:
        """The variables the ridge strengths are read from (none without ridge)."""
        if self.ridge_variable is None:
            return []
        return [self.ridge_variable, self.ridge_scale_variable]

    @property
    def ridge_strengths(self) -> Callable[[], tf.Tensor] | None:
        """The adapter's ridge strengths, or None: ``exp(scale * v)``, ``v`` the trained
        variable. The outer optimizer moves ``v`` at its rate, so the logs move ``scale``
        times as fast (its square under plain SGD; ``model_builder`` sets the scale so they
        learn at ``meta.ridge_lr``). The scale is a variable, saved with ``v``: a
        checkpoint's strengths do not depend on the config that reads it.
        """
        if self.ridge_variable is None:
            return None
        return lambda: tf.exp(self.ridge_scale_variable * self.ridge_variable)

    def set_ridge_strengths(self, strengths) -> None:
        """Sets every learned ridge strength (an array of ``ridge_size`` or a number)."""
        logs = np.log(np.broadcast_to(np.asarray(strengths, np.float64),
                                      self.ridge_variable.shape))
        self.ridge_variable.assign((logs / self.ridge_scale_variable.numpy()).astype(np.float32))

    def _create_inner_rates(self) -> dict[str, tf.Variable]:
        if not self.config.learn_inner_lr:
            return {}
        return {n: self.add_weight(name=f"inner_lr/{n}", shape=self._inner_rate_shape(n),
                                   trainable=True,
                                   initializer=tf.keras.initializers.Constant(self.config.inner_lr))
                for n in self.adapter.fast_names}

    def _inner_rate_shape(self, name: str) -> list[int]:
        """[] per tensor; per element: the weight's shape (an embedding offset: its width),
        which broadcasts over the fast weight's leading task (or pair) axis; per step: a
        leading axis of k."""
        steps = [self.config.inner_steps] if self.config.inner_lr_per_step else []
        if not self.config.inner_lr_per_element:
            return steps
        if name in self.adapter.embedding_fast:
            return steps + [self.tower.input_width]
        return steps + self.tower.params()[name].shape.as_list()

    @property
    def rates_per_step(self) -> bool:
        """True when each inner step has its own learned rates."""
        return bool(self.inner_lr_variables) and self.config.inner_lr_per_step

    def inner_learning_rates(self) -> dict[str, tf.Tensor]:
        """Fast weight name -> its inner learning rate (a learned variable under Meta-SGD)."""
        if self.inner_lr_variables:
            return dict(self.inner_lr_variables)
        return {n: tf.constant(self.config.inner_lr) for n in self.adapter.fast_names}

    @property
    def slow_variables(self) -> list[tf.Variable]:
        """Dense variables of the outer loop: the tower's, then the learned inner rates and
        ridge strengths."""
        ridge = [] if self.ridge_variable is None else [self.ridge_variable]
        return (list(self.tower.params().values()) + list(self.inner_lr_variables.values())
                + ridge)

    # -- the meta step -----------------------------------------------------------------

    def meta_loss(self, batch: TaskBatch, training: bool = True):
        """Query loss after adapting on the support sets (steps 1-3 of the class docstring).

        Returns:
            ``(query_loss, support_loss, slow_params, adapted_fast_weights, objective)``:
            the objective is what the outer loop differentiates, the query loss plus, in
            training with ``MetaConfig.plain_loss``, that weight times the plain loss.
        """
        support, query, num_pairs = role_batches(self.embedding, self.tower, self.head.label,
                                                 batch, training, self.config.adapt_embeddings)
        penalised = (support, query)
        if training:
            support, query = self._dropped(support), self._dropped(query)
        if training and self.config.label_shift:
            support, query = shifted_labels(support, query, self.config.label_shift)
        if training and self.config.task_interpolation:
            support, query = interpolated_tasks(support, query, self.config.task_interpolation)
        params = self.tower.params()
        fast = self.adapter.initial(params, tf.shape(support.mask)[0], num_pairs)
        trajectory = [] if training and self.config.multi_step_loss else None
        adapted, support_losses, _ = self.adapter.adapt(params, fast, support,
                                                        self.inner_learning_rates(),
                                                        self.config.first_order,
                                                        self.rates_per_step, trajectory,
                                                        self.config.grad_dropout
                                                        if training else 0.0)
        support_loss = tf.reduce_mean(support_losses)
        # The query rows' outputs under each step's fast weights (the last step's alone
        # without the multi-step loss); the trajectory's last entry is ``adapted``.
        steps = [adapted] if trajectory is None else trajectory
        outputs = [self.adapter.outputs(params, f, query) for f in steps]
        losses = tf.stack([tf.reduce_mean(self.head.masked_loss(query.labels, o, query.mask))
                           for o in outputs])
        if trajectory is None:
            query_loss = losses[0]
        else:
            query_loss = tf.reduce_sum(self.multi_step_weights() * losses)
        objective = query_loss
        if training and self.config.plain_loss:
            objective += self.config.plain_loss * self._plain_loss(params, fast, support, query,
                                                                   support_losses)
        if training and self.config.within_task_loss:
            objective += self.config.within_task_loss * tf.reduce_mean(
                self.head.within_task_loss(query.labels, outputs[-1], query.mask))
        if training and self.embedding_l2:
            objective += self.embedding_l2 * self._embedding_penalty(*penalised)
        return query_loss, support_loss, params, adapted, objective

    def _dropped(self, role: RoleBatch) -> RoleBatch:
        """``role`` with its embedded rows dropped out at ``embedding_dropout``."""
        if not self.embedding_dropout:
            return role
        return role._replace(inputs=dropped_embeddings(role.inputs, self.tower.sparse_features,
                                                       self.embedding_dropout))

    def _embedding_penalty(self, support, query) -> tf.Tensor:
        """``embedding_penalty`` over every real support and query row of the batch."""
        names = self.tower.sparse_features
        rows = [tf.reduce_sum(role.mask) for role in (support, query)]
        return (tf.add_n([embedding_penalty(role.inputs, names, role.mask) * n
                          for role, n in zip((support, query), rows)])
                / tf.maximum(tf.add_n(rows), 1.0))

    def _plain_loss(self, params, fast, support, query,
                    support_losses: tf.Tensor | None = None) -> tf.Tensor:
        """The unadapted loss, the mean over every real support and query row.
        ``support_losses``: each task's unadapted support loss when already computed (the
        inner loop's first step computes it), so the support rows are not run again."""
        losses, counts = [], []
        for role, known in ((support, support_losses), (query, None)):
            rows = tf.reduce_sum(role.mask, axis=1)
            task_losses = self.adapter.task_losses(params, fast, role) if known is None else known
            losses.append(task_losses * rows)
            counts.append(rows)
        return (tf.reduce_sum(tf.add_n(losses))
                / tf.maximum(tf.reduce_sum(tf.add_n(counts)), 1.0))

    def multi_step_weights(self) -> tf.Tensor:
        """``[k]`` weights of the query losses after each inner step (``multi_step_loss``):
        equal at the first meta step, all on the last step ``multi_step_loss`` meta steps
        later (pre-training steps, ``pretrained_steps``, do not count)."""
        k = self.config.inner_steps
        annealed = self.config.multi_step_loss or 1
        done = 0.0 if self.optimizer is None else tf.maximum(
            tf.cast(self.optimizer.iterations - self.pretrained_steps, tf.float32), 0.0)
        progress = tf.minimum(done / float(annealed), 1.0)
        last = tf.one_hot(k - 1, k)
        return (1.0 - progress) * tf.fill([k], 1.0 / k) + progress * last

    def meta_gradients(self, batch: TaskBatch) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        """Runs one meta step's forward and backward; applies the embedding update.

        Returns:
            ``(query_loss, support_loss, gradients)``, the local (not yet all-reduced)
            gradients of ``slow_variables``. The embedding's sparse optimizer has been
            applied (fused into the backward pass).
        """
        slow = self.slow_variables
        with tf.GradientTape() as tape:
            query_loss, support_loss, params, adapted, objective = self.meta_loss(batch)
        grads = tape.gradient(objective, slow + self.embedding.trainable_variables,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = list(grads[: len(slow)])
        if self.config.algorithm == "reptile":
            names = list(params)
            for n in self.adapter.tower_fast:
                i = names.index(n)
                grads[i] = params[n] - tf.reduce_mean(adapted[n], axis=0)
        return query_loss, support_loss, grads

    def pretrain_gradients(self, batch: TaskBatch) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """The plain objective on every real row of the batch's tasks, unadapted (what the
        baseline trains): ``(loss, gradients of slow_variables)``, the embedding's sparse
        optimizer applied as in :meth:`meta_gradients`."""
        slow = self.slow_variables
        with tf.GradientTape() as tape:
            support, query, num_pairs = role_batches(self.embedding, self.tower,
                                                     self.head.label, batch, True,
                                                     self.config.adapt_embeddings)
            params = self.tower.params()
            fast = self.adapter.initial(params, tf.shape(support.mask)[0], num_pairs)
            loss = self._plain_loss(params, fast, self._dropped(support), self._dropped(query))
            objective = loss
            if self.embedding_l2:
                objective += self.embedding_l2 * self._embedding_penalty(support, query)
        grads = tape.gradient(objective, slow + self.embedding.trainable_variables,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return loss, list(grads[: len(slow)])

    def pretrain_step(self, batch):
        """One step of :meth:`pretrain_gradients` (all-reduced, applied)."""
        loss, grads = self.pretrain_gradients(batch)
        grads = distributed.allreduce_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.slow_variables))
        return {"loss": loss, "support_loss": loss}

    def train_step(self, batch):
        query_loss, support_loss, grads = self.meta_gradients(batch)
        grads = distributed.allreduce_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.slow_variables))
        return {"loss": query_loss, "support_loss": support_loss}

    def test_step(self, batch):
        query_loss, support_loss, _, _, _ = self.meta_loss(batch, training=False)
        return {"loss": query_loss, "support_loss": support_loss}

    # -- evaluation and serving --------------------------------------------------------

    def adapted_query(self, batch: TaskBatch, steps: int | None = None) -> AdaptedQuery:
        """The query rows' raw outputs after adapting on the support rows, blended with the
        prior's fold-in (at the tower's ``prior_blend``) and not, and which tasks'
        adaptation was kept (``task_adapter.adapted_query``: a diverged one is undone).

        Embeddings are read without inserting (unknown ids read zero rows); nothing of the
        model changes. ``steps`` overrides k (0: no adaptation).
        """
        return adapted_query(self.embedding, self.adapter_for(steps), batch,
                             self.inner_learning_rates(), self.rates_per_step)

    def adapter_for(self, steps: int | None = None) -> TaskAdapter:
        """The inner loop that adapts a task for ``steps`` steps (None: the model's k), as
        ``gmeta eval`` adapts with ``eval.adapt_steps`` and the SavedModel serves."""
        return self.adapter if steps is None else TaskAdapter(
            self.tower, self.head, self.adapter.tower_fast, self.config.adapt_embeddings, steps,
            self.ridge_strengths)

    def adapted_outputs(self, batch: TaskBatch, steps: int | None = None,
                        blended: bool = True) -> tf.Tensor:
        """Raw tower outputs ``[T, Q]`` on the query rows after adapting on the support rows
        (``adapted_query``), blended with the prior's fold-in or (``blended=False``) not."""
        query = self.adapted_query(batch, steps)
        return query.blended if blended else query.unblended

    def adapted_predictions(self, batch: TaskBatch, steps: int | None = None,
                            blended: bool = True) -> tf.Tensor:
        """Predictions ``[T, Q]`` for the query rows after adapting on the support rows."""
        return self.head.predict(self.adapted_outputs(batch, steps, blended))

    def serve(self, support: Mapping[str, tf.Tensor],
              query: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Serving-time adaptation for ONE new task: its support rows -> query predictions.

        Args:
            support: The task's labelled rows ``{feature: [S] or [S, W], label: [S]}``.
            query: The rows to score ``{feature: [Q] or [Q, W]}`` (no label needed).

        Returns:
            ``[Q]`` predictions under the weights adapted to the support rows.
        """
        return tf.squeeze(self.adapted_predictions(single_task_batch(support, query,
                                                                     self.head.label)), 0)


def shifted_labels(support: RoleBatch, query: RoleBatch, width: float
                   ) -> tuple[RoleBatch, RoleBatch]:
    """``MetaConfig.label_shift``: each task's support and query labels plus one offset
    drawn uniformly from ``[-width, width]`` for that task."""
    shift = task_offsets(tf.shape(support.labels)[0], width)
    return (support._replace(labels=support.labels + shift),
            query._replace(labels=query.labels + shift))


def interpolated_tasks(support: RoleBatch, query: RoleBatch, rate: float,
                       concentration: float = 0.5) -> tuple[RoleBatch, RoleBatch]:
    """``MetaConfig.task_interpolation`` (MLTI): each task, with probability ``rate``,
    mixed with another task of the batch drawn at random, at weight ``lam ~
    Beta(concentration, concentration)`` on its own rows (one draw per task, shared by its
    support and query rows); the others keep ``lam = 1``. Row r of a task's role is mixed
    with the other task's real row of rank ``r mod n`` (n its real rows in that role);
    floating inputs and labels are mixed, other inputs and the mask are the task's own.
    (The task batcher packs a role's real rows first, so a position is a rank.)"""
    num_tasks = tf.shape(support.mask)[0]
    partner = tf.random.shuffle(tf.range(num_tasks))
    a = tf.random.gamma([num_tasks], concentration)
    b = tf.random.gamma([num_tasks], concentration)
    lam = a / tf.maximum(a + b, 1e-12)
    # Each role's real rows of each task's partner.
    partner_rows = [tf.gather(tf.cast(tf.reduce_sum(role.mask, axis=1), tf.int32), partner)
                    for role in (support, query)]
    mixed = ((tf.random.uniform([num_tasks]) < rate) & (partner != tf.range(num_tasks))
             & (partner_rows[0] > 0) & (partner_rows[1] > 0))
    lam = tf.where(mixed, lam, 1.0)
    return (_mixed_role(support, partner, partner_rows[0], lam),
            _mixed_role(query, partner, partner_rows[1], lam))


def _mixed_role(role: RoleBatch, partner: tf.Tensor, partner_rows: tf.Tensor,
                lam: tf.Tensor) -> RoleBatch:
    """One role of ``interpolated_tasks``: ``lam`` ``[T]`` on each task's own rows,
    ``partner_rows`` ``[T]`` its partner's real rows in this role."""
    width = tf.shape(role.mask)[1]
    # Each task's real rows first, in their order (padding last).
    order = tf.argsort(tf.cast(role.mask <= 0, tf.int32), axis=1, stable=True)
    ranks = tf.range(width)[None, :] % tf.maximum(partner_rows, 1)[:, None]
    rows = tf.gather(tf.gather(order, partner), ranks, batch_dims=1)  # [T, N]

    def mix(x: tf.Tensor) -> tf.Tensor:
        other = tf.gather(tf.gather(x, partner), rows, batch_dims=1)
        w = tf.reshape(tf.cast(lam, x.dtype), tf.concat([[-1], tf.ones([tf.rank(x) - 1],
                                                                      tf.int32)], 0))
        return w * x + (1 - w) * other

    inputs = {k: mix(v) if v.dtype.is_floating else v for k, v in role.inputs.items()}
    return role._replace(inputs=inputs, labels=mix(role.labels))


def task_offsets(num_tasks: tf.Tensor, width: float) -> tf.Tensor:
    """``[T, 1]`` offsets, each uniform on ``[-width, width]``."""
    return tf.random.uniform([num_tasks, 1], -width, width)


def single_task_batch(support: Mapping[str, tf.Tensor], query: Mapping[str, tf.Tensor],
                      label: str) -> dict:
    """Rows of one task -> a task batch of T=1 with all-ones masks (query label zeros)."""
    def role(rows, with_label):
        rows = {k: tf.convert_to_tensor(v)[None] for k, v in rows.items()}
        n = tf.shape(next(iter(rows.values())))[1]
        if not with_label or label not in rows:
            rows[label] = tf.zeros([1, n])
        rows["mask"] = tf.ones([1, n])
        return rows

    return {"support": role(support, True), "query": role(query, False)}
