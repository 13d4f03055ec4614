"""Entry point for torch's device-backend autoloading ("torch.backends"): a
module of its own, so that `import torchtpu` (which imports torch, which
autoloads) does not need the half-imported package to define anything."""


def load():
    # Every `import torch` runs this: whatever goes wrong in torchtpu must not
    # take torch down with it (torch would raise "Failed to load the backend
    # extension" in every script, CPU-only ones included). The settings and
    # torch versions torchtpu knows of degrade on their own; this is the last
    # resort, and `import torchtpu` still raises the error itself.
    try:
        import torchtpu  # noqa: F401  (importing it registers the device)
    except Exception as e:  # noqa: BLE001
        import warnings

        warnings.warn(
            f"torchtpu could not be loaded, so torch has no tpu device: {type(e).__name__}: {e}", stacklevel=2
        )
