"""The Hydra config groups, shipped inside the package (a package, so Hydra finds them as ``pkg://sve.configs``)."""
