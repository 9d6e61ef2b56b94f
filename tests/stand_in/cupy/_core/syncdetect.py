"""CuPy calls ``_declare_synchronize`` before every device-to-host copy or host wait; tests
wrap it to see those (tests/cuda/test_end_to_end.py). The stand-in calls it likewise."""


def _declare_synchronize():
    pass
