"""The mixed-precision graph pass over an MXNet Symbol (:func:`.convert.convert_symbol`)."""
