"""Entry point for torch's device-backend autoloading ("torch.backends"): a
module of its own, so that `import torchtpu` (which imports torch, which
autoloads) does not need the half-imported package to define anything."""


def load():
    import torchtpu  # noqa: F401  (importing it registers the device)
