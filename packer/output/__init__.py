"""Where a pack writes: the output directory (local or a URL), the progress file, the write order."""
