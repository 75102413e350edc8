"""Pixels: decoding, the crop-window JPEG decoder, resampling, crop/resize geometry, the BMP codec."""
