"""gmeta-tf: meta-learning recommendation models at scale on TensorFlow 2 + Horovod."""

import os

# Horovod 0.28.1 breaks on Keras 3 variables: the project runs on tf-keras (Keras 2).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# NumPy's BLAS single-threaded (before NumPy loads): TensorFlow owns the cores, and the
# NumPy fits beside it (the factor prior, the references) solve many small systems, where
# OpenBLAS's threads spin against busy cores: 61 s instead of 4 s for the MovieLens
# factor prior on 2 busy cores.
for _blas in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas, "1")

__version__ = "0.1.0"
