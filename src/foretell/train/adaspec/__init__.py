"""AdaSPEC (arXiv 2510.19779): a small draft model distilled from the target on the tokens it can learn."""
