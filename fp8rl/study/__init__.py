"""The study room: a study declares (``studies/<name>/study.py``), the room plans, runs and
reports it (DESIGN.md, Rooms: the top floor of ``fp8rl``; nothing in ``fp8rl`` imports it).

* :mod:`fp8rl.study.declaration` — :class:`Study`, :func:`load_study`;
* :mod:`fp8rl.study.plan` — the plan read from the presets;
* :mod:`fp8rl.study.writers` — the report writers;
* :mod:`fp8rl.study.cli` — ``python -m fp8rl.study {list,plan,status,run,report} NAME``.

Endpoints and claims are the analysis room's (:mod:`fp8rl.analysis.endpoints`,
:mod:`fp8rl.analysis.claims`), re-exported here for declarations.
"""

from fp8rl.analysis.claims import Claim
from fp8rl.study.declaration import STUDIES_DIR, Study, StudyError, known_studies, load_study

__all__ = ["STUDIES_DIR", "Claim", "Study", "StudyError", "known_studies", "load_study"]
