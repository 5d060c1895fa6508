"""Small datasets that ship inside the package (package data), so an installed relsql runs its
demo without a checkout or a download: ``relsql.datasets.mutagenesis``."""
