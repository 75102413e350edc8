"""The offline per-image transform and its geometry: preprocess, box geometry, stored sizes."""
