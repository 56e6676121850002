"""Stand-in package (see ``placement``)."""
