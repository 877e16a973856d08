"""Stage two's engine: training the stacked heads of a run's searches and selecting them.

:func:`~featcache.linear.engine.search.run_searches` is the way in: the searches' grid points
become stacked groups (:mod:`~featcache.linear.engine.stacking`), the groups go to the workers
(:mod:`~featcache.linear.engine.schedule`, :mod:`~featcache.linear.engine.workers`), and each
group trains (:mod:`~featcache.linear.engine.trainer`: one loss's share of a step in
:mod:`~featcache.linear.engine.member`, the batches from :mod:`~featcache.linear.engine.rows`,
the update by :mod:`~featcache.linear.engine.optimizer`, CUDA graphs by
:mod:`~featcache.linear.engine.graphs`) and is scored every epoch
(:mod:`~featcache.linear.engine.evaluation`). The engine reads the training data
(:mod:`featcache.linear.data`) and nothing of the ``train-linear`` command around it.
"""
