"""Image data: bundled digits, MNIST IDX files, image folders and TFDS datasets.

`pipeline.make_image_pipeline` is the entry point (`jaxformer.data.pipeline` calls it for
classification models). Each kind of `data.source` has its reader (digits.py, mnist.py,
folders.py, tfds.py) giving a `source.ImageSource`; all but TFDS are converted once into the
ArrayRecord cache (cache.py). stats.py computes the per-channel mean and std images are
standardised with, augment.py the training augmentation. captions.py composes digits of the
'digits' or 'mnist:<dir>' sources into captioned images (the captioning task).
"""
