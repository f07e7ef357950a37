"""Worker of test_distributed: trains the tiny meta model on this rank's share of T tasks.

Usage: ``python -m tests.meta.meta_step_worker OUT_DIR ALGORITHM[,ALGORITHM...]`` (under
horovodrun or alone). Rank r of N takes tasks ``[r*T/N, (r+1)*T/N)`` of every batch. Writes
``OUT_DIR/{algorithm}_rank{r}.npz`` with the dense weights, the embedding rows of every id,
and the collective counts of the steps. The name ``exchanges`` instead writes
``OUT_DIR/exchanges_rank{r}.npz``: for k = 1 and 5 inner steps, the collectives a MAML
step ran (counted at run time) and the Horovod all-to-all ops in its traced graph. The name ``undone`` writes
``OUT_DIR/undone_rank{r}.npz``: the meta model's and the fine-tuned baseline's adapted
figures (``adapted_query``) of two batches, each with one task whose adaptation diverges
on one rank's share only (the first batch on rank 0's, the second on the last rank's).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gmeta_tf import distributed  # noqa: E402
from gmeta_tf.meta import MetaConfig, fine_tuned_adaptation, query_predictions  # noqa: E402
from gmeta_tf.models.ctr_model import CTRModel  # noqa: E402
from tests.meta import tiny  # noqa: E402

NUM_TASKS, STEPS = 8, 3


def main(out_dir: str, algorithm: str) -> None:
    rank, size = distributed.rank(), distributed.size()
    config = MetaConfig(algorithm, inner_steps=2, inner_lr=0.2, learn_inner_lr=True,
                        adapt_embeddings=("item_id",))
    model = tiny.model(config, sparse_lr=0.1, optimizer="adagrad", multi_hot=True)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05))
    step = tf.function(model.train_step)
    share = NUM_TASKS // size
    batches = [tiny.tasks(NUM_TASKS, seed=100 + s, multi_hot=True) for s in range(STEPS)]
    distributed.reset_collective_counts()
    for batch in batches:
        step(tiny.task_slice(batch, rank * share, (rank + 1) * share))
    counts = distributed.collective_counts()
    ids = {"user_id": 100 + np.arange(NUM_TASKS), "item_id": np.arange(12)}
    rows = tiny.rows_of(model, ids)
    np.savez(os.path.join(out_dir, f"{algorithm}_rank{rank}.npz"),
             **{f"dense:{v.name}": v.numpy() for v in model.slow_variables},
             **{f"rows:{k}": v for k, v in rows.items()},
             **{f"count:{k}": v for k, v in counts.items()})


def _graph_alltoalls(concrete) -> int:
    """Horovod all-to-all ops in a traced function and every function it calls."""
    graph = concrete.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return sum(1 for n in nodes if n.op == "HorovodAlltoall")


def exchanges(out_dir: str, inner_steps: tuple[int, ...] = (1, 5)) -> None:
    rank, size = distributed.rank(), distributed.size()
    share = NUM_TASKS // size
    batch = tiny.task_slice(tiny.tasks(NUM_TASKS, seed=3), rank * share, (rank + 1) * share)
    out = {}
    for k in inner_steps:
        model = tiny.model(MetaConfig("maml", inner_steps=k, inner_lr=0.1))
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
        step = tf.function(model.train_step)
        out[f"k{k}:graph_alltoalls"] = _graph_alltoalls(step.get_concrete_function(batch))
        distributed.reset_collective_counts()
        for _ in range(STEPS):
            step(batch)
        out.update({f"k{k}:{name}": v for name, v in distributed.collective_counts().items()})
    np.savez(os.path.join(out_dir, f"exchanges_rank{rank}.npz"), **out)


def poisoned_batches() -> list[dict]:
    """Two batches of ``NUM_TASKS`` tasks; task 1 of the first and the last task of the
    second have support ratings far beyond the head's range (their adaptation diverges)."""
    out = []
    for seed, task in ((5, 1), (6, NUM_TASKS - 1)):
        batch = tiny.tasks(NUM_TASKS, seed=seed)
        batch["support"] = {**batch["support"], "rating": batch["support"]["rating"].copy()}
        batch["support"]["rating"][task] *= 1e30
        out.append(batch)
    return out


def undone(out_dir: str) -> None:
    """Each rank adapts its share of the poisoned batches: the unadapted pass (a
    ``tf.cond``) runs on one rank and not the other, while every embedding read is an
    all-to-all of both; the ranks must stay in step and score as one rank would."""
    rank, size = distributed.rank(), distributed.size()
    share = NUM_TASKS // size
    model = tiny.model(MetaConfig("maml", inner_steps=3, inner_lr=0.5))
    baseline = CTRModel(model.embedding, model.tower, model.head)
    batches = [tiny.task_slice(b, rank * share, (rank + 1) * share) for b in poisoned_batches()]
    for batch in batches:
        tiny.insert_ids(model, batch)
    predictors = {
        "meta": tf.function(lambda b: query_predictions(model.head, model.adapted_query(b))),
        "baseline": fine_tuned_adaptation(baseline, 3, 0.5, ridge=0.5)}
    out = {}
    for i, batch in enumerate(batches):
        for name, predict in predictors.items():
            out.update({f"{name}{i}:{k}": v.numpy() for k, v in predict(batch).items()})
    np.savez(os.path.join(out_dir, f"undone_rank{rank}.npz"), **out)


if __name__ == "__main__":
    for name in sys.argv[2].split(","):
        if name == "exchanges":
            exchanges(sys.argv[1])
        elif name == "undone":
            undone(sys.argv[1])
        else:
            main(sys.argv[1], name)
