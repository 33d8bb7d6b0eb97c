"""Experiments: each returns a tidy pandas DataFrame, one row per comparison (see table.COLUMNS)."""
