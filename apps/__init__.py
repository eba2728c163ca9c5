"""Complete programs built on the engines; each module has ``main(argv=None) -> int``."""
