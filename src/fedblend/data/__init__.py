"""Dataset sources (canonical archives, md5-checked), partitioners and federated datasets."""
