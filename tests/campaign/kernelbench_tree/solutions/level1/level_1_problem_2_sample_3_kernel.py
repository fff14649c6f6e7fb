"""A later sample for the same problem: not the one an eval takes (the lowest sample number is)."""

this is not Python
