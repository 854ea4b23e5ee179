// RUN: stageml-opt %s -p decompose-topk | filecheck %s

// A router's top-2 of 4 scores (split IR: the request stage), as two rounds
// of arg-max: the second round reads the scores with the first round's index
// masked to the lowest f32; the rounds' values and indices are concatenated
// in order (largest first).

// CHECK-LABEL: func.func @forward
// CHECK-DAG:     %[[IOTA:.*]] = torch.vtensor.literal(dense<[0, 1, 2, 3]> : tensor<4xsi64>) : !torch.vtensor<[4],si64>
// CHECK-DAG:     %[[LOW:.*]] = torch.vtensor.literal(dense<-3.40282347E+38> : tensor<f32>) : !torch.vtensor<[],f32>
// CHECK:         %[[V0:.*]], %[[I0:.*]] = torch.aten.max.dim %arg0, %{{.*}}, %{{.*}} : !torch.vtensor<[?,4],f32>, !torch.int, !torch.bool -> !torch.vtensor<[?,1],f32>, !torch.vtensor<[?,1],si64>
// CHECK:         %[[TAKEN:.*]] = torch.aten.eq.Tensor %[[IOTA]], %[[I0]] : !torch.vtensor<[4],si64>, !torch.vtensor<[?,1],si64> -> !torch.vtensor<[?,4],i1>
// CHECK:         %[[REST:.*]] = torch.aten.where.self %[[TAKEN]], %[[LOW]], %arg0
// CHECK:         %[[V1:.*]], %[[I1:.*]] = torch.aten.max.dim %[[REST]]
// CHECK:         %[[VL:.*]] = torch.prim.ListConstruct %[[V0]], %[[V1]]
// CHECK:         %[[V:.*]] = torch.aten.cat %[[VL]], %{{.*}} : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[?,2],f32>
// CHECK:         %[[IL:.*]] = torch.prim.ListConstruct %[[I0]], %[[I1]]
// CHECK:         %[[I:.*]] = torch.aten.cat %[[IL]], %{{.*}} : !torch.list<vtensor>, !torch.int -> !torch.vtensor<[?,2],si64>
// CHECK-NOT:     torch.aten.topk
// CHECK:         return %[[V]], %[[I]]
func.func @forward(%arg0: !torch.vtensor<[?,4],f32> {bt.kind = "input", bt.name = "scores"}) -> (!torch.vtensor<[?,2],f32>, !torch.vtensor<[?,2],si64>) attributes {bt.program = "main", bt.stage = "dynamic"} {
  %int2 = torch.constant.int 2
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %values, %indices = torch.aten.topk %arg0, %int2, %int-1, %true, %true : !torch.vtensor<[?,4],f32>, !torch.int, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[?,2],f32>, !torch.vtensor<[?,2],si64>
  return %values, %indices : !torch.vtensor<[?,2],f32>, !torch.vtensor<[?,2],si64>
}
