"""The degradation ladder in the filter server: per-pool steps taken from the pool state
(:mod:`poolstate.ladder` decides), applied by the ``degrade`` plugin."""
