"""dsgraph.runtime: sessions, the C++ runtime (`dsgraph.runtime._native`) and the user APIs.

`_native` is not imported here, so pure-Python parts of the runtime stay importable (and
their import errors readable) even where the extension has not been built.
"""

from __future__ import annotations
