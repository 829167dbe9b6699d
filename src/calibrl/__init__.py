"""calibrl: reproduce "When Sharpening Becomes Collapse" (arXiv 2601.15609) as a Snakemake workflow."""

__version__ = "0.1.0"
