"""The web dashboard: a few static pages (plain HTML, CSS and JavaScript modules; Chart.js
vendored with its licence) served by the corral server itself under ``/ui/``. The pages
only read the JSON API (``/v1/…``) and send the same requests the CLI does, with the
visitor's bearer token when there is one; nothing here holds state or decides anything."""

from corral.web.pages import install

__all__ = ["install"]
