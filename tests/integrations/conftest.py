from tests.kernel.conftest import clock, kernel  # noqa: F401  (fixtures)
