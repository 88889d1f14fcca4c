"""End-to-end tests against a real local control plane (see devcluster/); the fixtures come from the
devcluster.fixtures plugin, loaded for every run by pyproject's addopts."""
