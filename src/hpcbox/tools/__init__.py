"""Thin wrappers, one per external program; each surfaces the program's stderr on failure."""
