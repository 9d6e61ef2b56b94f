"""``cupyx.scipy.special`` of the stand-in: SciPy's ufuncs on device operands."""

import scipy.special as _special
from cupy import _device_function

erf = _device_function(_special.erf)
erfc = _device_function(_special.erfc)
