"""Finding what to edit: the findings files and their cache, and the two finders."""
