"""FFCV's contracts, adapted onto beton's in one place.

* :mod:`~beton.ffcv.fields`: fields written to FFCV's field contract (``encode(destination, value, malloc)``,
  ``to_binary``/``from_binary``, ``get_decoder_class``), and subclasses of beton's built-in fields that override
  ``encode`` FFCV's way, stored and read as beton fields;
* :mod:`~beton.ffcv.operations`: transforms and decoders written to FFCV's operation contract
  (``declare_state_and_memory``, ``generate_code``), run in beton pipelines, with :mod:`~beton.ffcv.kernels`
  (their functions as compiled kernels that fuse into stages) and :mod:`~beton.ffcv.memory` (the pointers of
  FFCV-style fields and the ``memory_read`` that follows them);
* :mod:`~beton.ffcv.traversal_order`: FFCV's custom-order base, run as a beton order.

The core never imports this package: importing it registers the three adapters with the seams below the core,
where FFCV's contracts enter (the field registry, :func:`beton.fields.registry.register_contract`; pipeline
planning, :func:`beton.pipeline.contracts.register_operation_contract`; the Loader's order resolution,
:func:`beton.order.contracts.register_order_contract`). ``import beton`` imports it, so every program that uses
beton has them. FFCV files (no contract, a file layout) are read by storage: :mod:`beton.storage.ffcv_format`.
FFCV's import paths are faces elsewhere (``beton.traversal_order``, ``beton.pipeline.state``, ...).
"""

from beton.fields.registry import register_contract
from beton.ffcv import fields, operations, traversal_order
from beton.order.contracts import register_order_contract
from beton.pipeline.contracts import register_operation_contract

register_contract(fields.CONTRACT)
register_contract(fields.SUBCLASS_CONTRACT)
register_operation_contract(operations.CONTRACT)
register_order_contract(traversal_order.CONTRACT)
