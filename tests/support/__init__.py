"""What several test modules share: a small catalog on disk, the dev stack started as a test starts it, an independent
oracle replaying the simulated sources, a dependency center stepped at pinned times, tiny code locations."""
