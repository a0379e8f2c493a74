"""Programs that run inside the code domain's sandbox, shipped as their source text.

``rlonce_run.py`` is the test launcher that ``rlonce.envs.code.testbed.install_launcher`` writes,
byte for byte, into the read-only testbed. It is standalone (standard library, then the
testbed's pytest; never ``rlonce``) with a ``main(argv)`` entry; importing it on the host is for
unit tests only.
"""
