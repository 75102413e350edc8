"""Pixels: decoding, the crop-window JPEG decoder, resampling, crop/resize geometry, the BMP codec.

- ``decode``: CPU decoding of records, fastest decoder first, and the output kinds;
- ``jpegwindow``: decoding only a JPEG's crop window;
- ``resample``: the one CPU resampler, for pack time and every CPU read path;
- ``geometry``: resize targets, centre crops, ``RandomResizedCrop``, flips;
- ``bmpcodec``: BMP decoding with NumPy and the BMP cache's encoder.
"""
