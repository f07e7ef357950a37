"""Runs an exported SavedModel in a process that never imports gmeta_tf (as TF Serving would).

Usage: ``python serving_check.py SAVED_MODEL INPUTS.npz OUTPUTS.npz``. INPUTS holds
``serve/<name>`` arrays for ``serving_default`` and ``adapt/<name>`` for ``adapt``.
Writes the scores, plus whether gmeta_tf or its op library got loaded.
"""

import sys

import numpy as np
import tensorflow as tf


def main(model_dir: str, inputs_path: str, outputs_path: str) -> None:
    model = tf.saved_model.load(model_dir)
    with np.load(inputs_path) as data:
        arrays = {k: data[k] for k in data.files}
    outputs = {}
    for signature in ("serve", "adapt"):
        given = {k.split("/", 1)[1]: tf.constant(v) for k, v in arrays.items()
                 if k.startswith(signature + "/")}
        name = "serving_default" if signature == "serve" else "adapt"
        if given:
            outputs[signature] = model.signatures[name](**given)["scores"].numpy()
    with open("/proc/self/maps") as maps:
        op_library = "libgmeta_ops" in maps.read()
    imported = any(m == "gmeta_tf" or m.startswith("gmeta_tf.") for m in sys.modules)
    np.savez(outputs_path, **outputs, gmeta_imported=imported, op_library_loaded=op_library)


if __name__ == "__main__":
    main(*sys.argv[1:])
