"""Static files under hashed names, compressed, cached for good.

`HashedStaticStorage` is WhiteNoise's CompressedManifestStaticFilesStorage: `collectstatic` (which
`manage.py serve` runs at every start) writes each file under a content-hashed name
(`console.1525238fa3f4.js`) with a gzip copy beside it, and WhiteNoise serves those names with
`Cache-Control: max-age=315360000, public, immutable` and `Content-Encoding: gzip` to a browser that
accepts it. A name the manifest does not hold yet — a checkout where collectstatic never ran, a
file added since — falls back to its plain name, which WhiteNoise serves from the source tree
(WHITENOISE_USE_FINDERS) with a short cache.
"""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class HashedStaticStorage(CompressedManifestStaticFilesStorage):
    manifest_strict = False

    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:  # not collected: neither in the manifest nor in STATIC_ROOT
            return name
