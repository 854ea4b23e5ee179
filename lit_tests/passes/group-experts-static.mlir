// RUN: stageml-opt %s -p 'group-experts{block=8,min-rows=32}' | filecheck %s

// After bt-split of a model compiled without dynamic shapes: the count of routed
// rows is known now, so no prim.If is left. 40 rows (at least min-rows): the
// products are grouped in 40/8 + 4 = 9 blocks of 8 rows, every shape static; 16
// rows: the per-row product stays as it is.

// CHECK-LABEL: func.func @forward
// CHECK-NOT:     torch.prim.If
// CHECK:         torch.aten.index_put.hacked_twin {{.*}} -> !torch.vtensor<[72,6],f32>
// CHECK:         torch.aten.bmm {{.*}} : !torch.vtensor<[9,8,6],f32>, !torch.vtensor<[9,6,12],f32> -> !torch.vtensor<[9,8,12],f32>
// CHECK:         %[[OUT:[0-9]+]] = torch.aten.view {{.*}} -> !torch.vtensor<[40,1,12],f32>
// CHECK:         %[[ROWS:[0-9]+]] = torch.aten.index_select %arg0, %int0, %arg4 : {{.*}} -> !torch.vtensor<[16,6,12],f32>
// CHECK-NEXT:    %[[FEW:[0-9]+]] = torch.aten.bmm %arg3, %[[ROWS]]
// CHECK:         return %[[OUT]], %[[FEW]]
func.func @forward(%arg0: !torch.vtensor<[4,6,12],f32> {bt.kind = "parameter", bt.name = "experts.gate_up_proj"}, %arg1: !torch.vtensor<[40,1,6],f32> {bt.kind = "input", bt.name = "x"}, %arg2: !torch.vtensor<[40],si64> {bt.kind = "input", bt.name = "expert_ids"}, %arg3: !torch.vtensor<[16,1,6],f32> {bt.kind = "input", bt.name = "y"}, %arg4: !torch.vtensor<[16],si64> {bt.kind = "input", bt.name = "y_expert_ids"}) -> (!torch.vtensor<[40,1,12],f32> {bt.kind = "output", bt.name = "output.0"}, !torch.vtensor<[16,1,12],f32> {bt.kind = "output", bt.name = "output.1"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
  %int0 = torch.constant.int 0
  %0 = torch.aten.index_select %arg0, %int0, %arg2 : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[40],si64> -> !torch.vtensor<[40,6,12],f32>
  %1 = torch.aten.bmm %arg1, %0 : !torch.vtensor<[40,1,6],f32>, !torch.vtensor<[40,6,12],f32> -> !torch.vtensor<[40,1,12],f32>
  %2 = torch.aten.index_select %arg0, %int0, %arg4 : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[16],si64> -> !torch.vtensor<[16,6,12],f32>
  %3 = torch.aten.bmm %arg3, %2 : !torch.vtensor<[16,1,6],f32>, !torch.vtensor<[16,6,12],f32> -> !torch.vtensor<[16,1,12],f32>
  return %1, %3 : !torch.vtensor<[40,1,12],f32>, !torch.vtensor<[16,1,12],f32>
}
