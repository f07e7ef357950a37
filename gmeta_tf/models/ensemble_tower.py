"""EnsembleTower: several towers trained side by side as one model, their outputs averaged."""

from __future__ import annotations

from typing import Mapping, Sequence

import tensorflow as tf

from gmeta_tf.models.dense_stack import Params
from gmeta_tf.models.tower import Tower

#: Member ``m`` of an ensemble is seeded ``seed + MEMBER_SEED_STRIDE * m`` (a tower seeds
#: its layers from its seed upward: members stay apart), as is fit ``m`` of the linear
#: reference averaged alongside it (``references.fit_references``).
MEMBER_SEED_STRIDE = 1000


def member_prefix(index: int) -> str:
    """The prefix of member ``index``'s weights among the ensemble's parameters."""
    return f"member{index}/"


class EnsembleTower(Tower):
    """``M`` towers of one architecture, each with its own initial weights and embedding
    rows, trained at once on the same batches, each on its own loss; the output is the
    mean of their raw outputs (logits or ratings).

    A deep model trained on a few thousand rows lands somewhere different for every
    initial draw of its weights, and on a small file that spread moves its AUC by several
    hundredths; the mean of independently initialised members (a deep ensemble,
    Lakshminarayanan et al. 2017) keeps what they agree on. Every member reads its own
    slice of each embedded row: the table rows are ``M * input_width`` wide and member
    ``m`` reads columns ``[m * w, (m + 1) * w)``, so one lookup serves all and a row's
    slices start as independent random draws. ``member_outputs`` gives the members' raw
    outputs ``[..., M]``; ``CTRModel`` trains on the sum of the members' losses, so each
    member's gradient is the one it would get alone (the embedding penalty of full rows is
    the members' penalties summed). One model to checkpoint, restore, export and serve.

    Args:
        members: The towers (at least two), built alike but seeded apart; they read the
            same features.

    Example::

        tower = EnsembleTower([DLRMTower(names, 8, seed=s, name=f"m{s}") for s in (0, 1, 2)])
        tower.input_width   # 3 * 9 with linear, 3 * 8 without
    """

    def __init__(self, members: Sequence[Tower], **kwargs):
        members = list(members)
        if len(members) < 2:
            raise ValueError(f"EnsembleTower: {len(members)} member(s), expected at least 2")
        first = members[0]
        for m in members[1:]:
            if (m.sparse_features, m.dense_features, m.input_width) != (
                    first.sparse_features, first.dense_features, first.input_width):
                raise ValueError(f"EnsembleTower: member {m.name} reads other features or row "
                                 f"widths than {first.name}")
        if any(m.prior is not None for m in members):
            raise ValueError("EnsembleTower: members with a label prior are not supported")
        super().__init__(first.sparse_features, first.embedding_dim, first.dense_features,
                         first.seed, first.linear, **kwargs)
        self.members = members

    @property
    def num_members(self) -> int:
        return len(self.members)

    @property
    def input_width(self) -> int:
        return len(self.members) * self.members[0].input_width

    def vectors(self, features: Mapping[str, tf.Tensor]) -> list[tf.Tensor]:
        raise NotImplementedError("an ensemble's rows hold one slice per member: "
                                  "use member_features")

    def _create_weights(self) -> dict[str, tf.Variable]:
        return {member_prefix(i) + name: v
                for i, m in enumerate(self.members) for name, v in m.params().items()}

    def set_dense_scaling(self, shift, scale, logged=None) -> None:
        """Sets every member's dense inputs' scaling (and the ensemble's own, kept
        alike)."""
        super().set_dense_scaling(shift, scale, logged)
        for m in self.members:
            m.set_dense_scaling(shift, scale, logged)

    def dense_scaling_variables(self) -> list[tf.Variable]:
        return super().dense_scaling_variables() + [
            v for m in self.members for v in m.dense_scaling_variables()]

    def member_features(self, index: int, features: Mapping[str, tf.Tensor]) -> dict:
        """What member ``index`` reads: its slice of every embedded row, the rest as is."""
        w = self.members[0].input_width
        out = dict(features)
        for f in self.sparse_features:
            out[f] = features[f][..., index * w:(index + 1) * w]
        return out

    def member_outputs(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Every member's raw output, ``[..., M]``."""
        outs = []
        for i, m in enumerate(self.members):
            prefix = member_prefix(i)
            own = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
            outs.append(m.apply(own, self.member_features(i, features)))
        return tf.stack(outs, axis=-1)

    def apply(self, params: Params, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return tf.reduce_mean(self.member_outputs(params, features), axis=-1)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(members=[m.get_config() for m in self.members])
        return config
