"""What several methods use, below the methods (DESIGN principle 11): a method module imports these parts,
``core`` and ``common``, and at most the base method it extends (``tests/test_layering.py`` checks it).

* :mod:`.rows` -- per-client tables on the server and models built from a row of weights over them;
* :mod:`.proximal` -- the proximal pull as a loss term;
* :mod:`.mix` -- interpolation of parameter dictionaries;
* :mod:`.features` -- the body's output over a client's data; :mod:`.prototypes` -- class prototypes and the
  base of methods that upload them instead of parameters;
* :mod:`.nets` -- small functional networks (MLP, LSTM) for server-side learners; :mod:`.hypernet` -- training a
  hypernetwork by the vector-Jacobian product of its output;
* :mod:`.ownloop` -- functional losses, gradients and batch streams for methods whose client update is a loop of
  their own, and :class:`~.ownloop.OwnLoopMethod`.

Each part has two or more users; what one method alone uses lives in that method's package
(``algorithms/pfedrlla/``, ``algorithms/fedalp/``, ``algorithms/ala/``).

Optimizers (SGD, Adam as data) are one level lower, in :mod:`fedblend.core.optim`, because the vmap backend uses
them too.
"""
