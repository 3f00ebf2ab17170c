"""See doc/interfaces.md."""
