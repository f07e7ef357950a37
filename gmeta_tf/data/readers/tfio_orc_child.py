"""Child-process entry of the guarded tensorflow-io ORC reader (see ``readers.tfio``)."""

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from gmeta_tf.data.readers.tfio import _child_main  # noqa: E402

if __name__ == "__main__":
    _child_main(sys.argv[1:])
