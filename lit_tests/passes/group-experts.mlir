// RUN: stageml-opt %s -p 'group-experts{block=8,min-rows=32}' | filecheck %s

// After bt-split: a request-time function multiplies each routed row by its
// expert's matrix, gathered from a parameter stack [E, K, O] by the routed
// ids. From min-rows rows on, the rows are placed in blocks of `block` rows of
// one expert (rank by cumsum of the one-hot ids, scattered by index_put) and
// each block multiplies its expert's matrix once; fewer rows keep the per-row
// product. A slot table (a resident argument: per-row LoRA factors) is left alone.

// CHECK-LABEL: func.func @forward
// CHECK:         %[[N:[0-9]+]] = torch.aten.size.int %arg2, %int0
// CHECK:         %[[LONG:[0-9]+]] = torch.aten.ge.int %[[N]], %int32
// CHECK:         %[[Y:[0-9]+]] = torch.prim.If %[[LONG]] -> (!torch.vtensor<[?,1,12],f32>) {
// CHECK:           torch.aten.eq.Tensor {{.*}} -> !torch.vtensor<[?,4],i1>
// CHECK:           torch.aten.cumsum {{.*}} -> !torch.vtensor<[?,4],si64>
// CHECK:           torch.aten.div.Tensor_mode
// CHECK:           %[[POS:[0-9]+]] = torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[?],si64>
// CHECK:           %[[PLACED:[0-9]+]] = torch.aten.index_put.hacked_twin {{.*}} -> !torch.vtensor<[?,6],f32>
// CHECK:           torch.aten.arange.start_step
// CHECK:           %[[OWNER:[0-9]+]] = torch.aten.clamp {{.*}} -> !torch.vtensor<[?],si64>
// CHECK:           %[[W:[0-9]+]] = torch.aten.index_select %arg0, %{{.*}}, %[[OWNER]] : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,12],f32>
// CHECK:           %[[BLOCKS:[0-9]+]] = torch.aten.view %[[PLACED]], {{.*}} -> !torch.vtensor<[?,8,6],f32>
// CHECK:           %[[P:[0-9]+]] = torch.aten.bmm %[[BLOCKS]], %[[W]] : !torch.vtensor<[?,8,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,8,12],f32>
// CHECK:           %[[FLAT:[0-9]+]] = torch.aten.view %[[P]]
// CHECK:           %[[BACK:[0-9]+]] = torch.aten.index_select %[[FLAT]], %{{.*}}, %[[POS]]
// CHECK:           %[[OUT:[0-9]+]] = torch.aten.view %[[BACK]], {{.*}} -> !torch.vtensor<[?,1,12],f32>
// CHECK:           torch.prim.If.yield %[[OUT]]
// CHECK:         } else {
// CHECK:           %[[ROWS:[0-9]+]] = torch.aten.index_select %arg0, %{{.*}}, %arg2
// CHECK:           %[[R:[0-9]+]] = torch.aten.bmm %arg1, %[[ROWS]]
// CHECK:           torch.prim.If.yield %[[R]]
// CHECK:         }
// CHECK:         return %[[Y]]
func.func @forward(%arg0: !torch.vtensor<[4,6,12],f32> {bt.kind = "parameter", bt.name = "experts.gate_up_proj"}, %arg1: !torch.vtensor<[?,1,6],f32> {bt.kind = "input", bt.name = "x"}, %arg2: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "expert_ids"}) -> (!torch.vtensor<[?,1,12],f32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
  %int0 = torch.constant.int 0
  %0 = torch.aten.index_select %arg0, %int0, %arg2 : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,12],f32>
  %1 = torch.aten.bmm %arg1, %0 : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
  return %1 : !torch.vtensor<[?,1,12],f32>
}

// CHECK-LABEL: func.func @forward_factorized
// CHECK-NOT:     torch.prim.If
// CHECK:         %[[ROWS:[0-9]+]] = torch.aten.index_select %arg0, %int0, %arg2
// CHECK-NEXT:    torch.aten.bmm %arg1, %[[ROWS]]
func.func @forward_factorized(%arg0: !torch.vtensor<[12,6,2],f32> {bt.kind = "resident", bt.name = "factorized.adapter.0"}, %arg1: !torch.vtensor<[?,1,6],f32> {bt.kind = "input", bt.name = "x"}, %arg2: !torch.vtensor<[?],si64> {bt.kind = "input", bt.name = "entries"}) -> (!torch.vtensor<[?,1,2],f32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
  %int0 = torch.constant.int 0
  %0 = torch.aten.index_select %arg0, %int0, %arg2 : !torch.vtensor<[12,6,2],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,2],f32>
  %1 = torch.aten.bmm %arg1, %0 : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,2],f32> -> !torch.vtensor<[?,1,2],f32>
  return %1 : !torch.vtensor<[?,1,2],f32>
}
