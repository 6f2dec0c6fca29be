"""Filesystem layers, snapshots, and whiteouts applied by hand."""
