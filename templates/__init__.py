"""Jinja templates of the generated kernel (``megakernel.templates``)."""
