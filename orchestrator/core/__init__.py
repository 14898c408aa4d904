"""What every part of kappa shares: settings, names, paths, version states, pipeline specs, errors.

Nothing here imports the registry, the lifecycle verbs or the front ends; they import this.
"""
