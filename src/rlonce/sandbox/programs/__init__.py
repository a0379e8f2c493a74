"""Programs that run inside a sandbox, shipped as their source text.

Each module here is standalone (standard library only, never ``rlonce``: it runs where rlonce
is not installed) and has a ``main(argv)`` entry. The host reads a module's source and hands it
to the sandbox's own interpreter; importing it on the host is for unit tests only.
"""
