"""The precision policy (:mod:`.policy`) and the op tables it reads (:mod:`.tables`)."""
