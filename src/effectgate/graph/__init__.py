"""effectgate subpackage (filled in by its issue)."""
