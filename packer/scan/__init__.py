"""What a source is as data: the source registry, the scanned entries and rows with fields."""
