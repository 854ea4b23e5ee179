// RUN: stageml-opt %s -p index-bounds | filecheck %s

// The input is bt-split's output. Every index into a table is bounded by
// the table's size along the indexed dimension: clamped into [0, n-1] for
// embedding, index_select and gather (PyTorch rejects negative indices
// there), taken modulo n for index.Tensor and index_put (PyTorch wraps
// them; index_put writes, into a buffer the model mutates here). A table
// whose size is dynamic is bounded by its size at run time; a resident
// table (@forward_factorized's %arg1, typed [?,4,12]) by its declared slot
// count (bt.resident: 3). A stage argument used directly as indices
// records the values it may take: bt.range, narrowed over all its uses.

module attributes {bt.resident = [{dtype = "float32", name = "factorized.adapter.0", owner = "adapter", program = "factorized", shape = [3, 4, 12], slot_dim = 0 : i64}], bt.tenants = {max_adapters = 2 : i64, max_rank = 4 : i64}} {

// CHECK-LABEL: func.func @forward(
// CHECK-SAME:    %arg1: !torch.vtensor<[?,?],si64> {bt.kind = "input", bt.name = "ids", bt.range = {max = 99 : i64, min = 0 : i64}}
// CHECK-SAME:    %arg2: !torch.vtensor<[?,?],f32> {bt.kind = "input", bt.name = "x"}
// CHECK-SAME:    %arg3: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "rows", bt.range = {max = 7 : i64, min = -8 : i64}}
// CHECK-SAME:    %arg6: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "slots", bt.range = {max = 5 : i64, min = -6 : i64}}
// CHECK:         %[[LAST:.+]] = torch.constant.int 99
// CHECK:         %[[IDS:.+]] = torch.aten.clamp %arg1, %{{.+}}, %[[LAST]]
// CHECK:         torch.aten.embedding %arg0, %[[IDS]]
// A dynamic table: its size, read at run time.
// CHECK:         %[[N:.+]] = torch.aten.size.int %arg2, %{{.+}}
// CHECK:         %[[M:.+]] = torch.aten.sub.int %[[N]], %{{.+}}
// CHECK:         %[[G:.+]] = torch.aten.clamp %arg1, %{{.+}}, %[[M]]
// CHECK:         torch.aten.gather %arg2, %{{.+}}, %[[G]]
// CHECK:         %[[EIGHT:.+]] = torch.constant.int 8
// CHECK:         %[[R:.+]] = torch.aten.remainder.Scalar %arg3, %[[EIGHT]]
// CHECK:         %[[LIST:.+]] = torch.prim.ListConstruct %[[R]]
// CHECK:         torch.aten.index.Tensor_hacked_twin %{{.+}}, %[[LIST]]
// CHECK:         %[[SIX:.+]] = torch.constant.int 6
// CHECK:         %[[S:.+]] = torch.aten.remainder.Scalar %arg6, %[[SIX]]
// CHECK:         %[[AT:.+]] = torch.prim.ListConstruct %[[S]]
// CHECK:         torch.aten.index_put.hacked_twin %arg5, %[[AT]]
func.func @forward(%arg0: !torch.vtensor<[100,16],f32> {bt.kind = "parameter", bt.name = "embed.weight"},
                   %arg1: !torch.vtensor<[?,?],si64> {bt.kind = "input", bt.name = "ids"},
                   %arg2: !torch.vtensor<[?,?],f32> {bt.kind = "input", bt.name = "x"},
                   %arg3: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "rows"},
                   %arg4: !torch.vtensor<[8,16],f32> {bt.kind = "parameter", bt.name = "table"},
                   %arg5: !torch.vtensor<[6,16],f32> {bt.kind = "buffer", bt.name = "cache"},
                   %arg6: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "slots"})
    -> (!torch.vtensor<[?,?,16],f32> {bt.kind = "output", bt.name = "output.0"}, !torch.vtensor<[?,?],f32> {bt.kind = "output", bt.name = "output.1"}, !torch.vtensor<[?,16],f32> {bt.kind = "output", bt.name = "output.2"}, !torch.vtensor<[6,16],f32> {bt.kind = "buffer", bt.name = "cache"})
    attributes {bt.program = "main", bt.stage = "dynamic"} {
  %int-1 = torch.constant.int -1
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %0 = torch.aten.embedding %arg0, %arg1, %int-1, %false, %false : !torch.vtensor<[100,16],f32>, !torch.vtensor<[?,?],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,?,16],f32>
  %1 = torch.aten.gather %arg2, %int1, %arg1, %false : !torch.vtensor<[?,?],f32>, !torch.int, !torch.vtensor<[?,?],si64>, !torch.bool -> !torch.vtensor<[?,?],f32>
  %2 = torch.prim.ListConstruct %arg3 : (!torch.vtensor<[?],si64>) -> !torch.list<vtensor>
  %3 = torch.aten.index.Tensor_hacked_twin %arg4, %2 : !torch.vtensor<[8,16],f32>, !torch.list<vtensor> -> !torch.vtensor<[?,16],f32>
  %4 = torch.prim.ListConstruct %arg6 : (!torch.vtensor<[?],si64>) -> !torch.list<vtensor>
  %5 = torch.aten.index_put.hacked_twin %arg5, %4, %3, %false : !torch.vtensor<[6,16],f32>, !torch.list<vtensor>, !torch.vtensor<[?,16],f32>, !torch.bool -> !torch.vtensor<[6,16],f32>
  return %0, %1, %3, %5 : !torch.vtensor<[?,?,16],f32>, !torch.vtensor<[?,?],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[6,16],f32>
}

// CHECK-LABEL: func.func @forward_factorized(
// CHECK-SAME:    %arg2: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "adapter_ids", bt.range = {max = 2 : i64, min = 0 : i64}}
// CHECK:         %[[SLOTS:.+]] = torch.aten.clamp %arg2, %{{.+}}, %int2
// CHECK:         torch.aten.index_select %arg1, %{{.+}}, %[[SLOTS]]
func.func @forward_factorized(%arg0: !torch.vtensor<[?,16],f32> {bt.kind = "input", bt.name = "x"},
                              %arg1: !torch.vtensor<[?,4,12],f32> {bt.kind = "resident", bt.name = "factorized.adapter.0"},
                              %arg2: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "adapter_ids"})
    -> (!torch.vtensor<[?,4,12],f32> {bt.kind = "output", bt.name = "output.0"})
    attributes {bt.program = "factorized", bt.stage = "dynamic"} {
  %int0 = torch.constant.int 0
  %0 = torch.aten.index_select %arg1, %int0, %arg2 : !torch.vtensor<[?,4,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,4,12],f32>
  return %0 : !torch.vtensor<[?,4,12],f32>
}
}
