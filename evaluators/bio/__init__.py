"""Biology problems (SPEC §5d): candidates run in the `bio` image (images/bio)."""
