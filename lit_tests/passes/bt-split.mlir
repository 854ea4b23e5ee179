// RUN: stageml-opt %s -p bt-annotate,bt-propagate,bt-lift,bt-split --stage 'fc.weight=static' --stage 'fc.delta=adapter' | filecheck %s
// RUN: stageml-opt %s -p bt-annotate,bt-propagate,bt-lift,bt-split --stage 'fc.weight=static' --stage 'fc.delta=static' | filecheck %s --check-prefix=NOADAPTER

// @main becomes @static, @adapter and @forward. A later stage's arguments
// are the values lifted from static, then from adapter, then the model's own
// arguments of that time; each lift of a computed value is a result of the
// earlier stage with the same bt.name, while a static argument used as it is
// (fc.weight, returned below) is not routed through @static. Constants are
// cloned into every stage that uses them. An unused weight (an inactive
// adapter's) is dropped; an unused request input stays, so that callers pass
// the inputs the model declares.

// CHECK-NOT:   func.func @main
// CHECK-LABEL: func.func @static
// CHECK-SAME:    (%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">})
// CHECK-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.name = "static.0"})
// CHECK:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK-NEXT:    return %[[WT]] : !torch.vtensor<[8,4],f32>

// CHECK-LABEL: func.func @adapter
// CHECK-SAME:    (%arg0: !torch.vtensor<[8,4],f32> {bt.name = "static.0", bt.time = #bt.time<"static">},
// CHECK-SAME:     %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">})
// CHECK-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.name = "adapter.0"})
// CHECK-DAG:     %int0 = torch.constant.int 0
// CHECK-DAG:     %int1 = torch.constant.int 1
// CHECK:         %[[DT:[0-9]+]] = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT:    %[[M:[0-9]+]] = torch.aten.add.Tensor %arg0, %[[DT]], %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT:    return %[[M]] : !torch.vtensor<[8,4],f32>

// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: !torch.vtensor<[8,4],f32> {bt.name = "static.0", bt.time = #bt.time<"static">},
// CHECK-SAME:     %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">},
// CHECK-SAME:     %arg2: !torch.vtensor<[8,4],f32> {bt.name = "adapter.0", bt.time = #bt.time<"adapter">},
// CHECK-SAME:     %arg3: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">},
// CHECK-SAME:     %arg4: !torch.vtensor<[?,8],f32> {bt.name = "unused_input", bt.time = #bt.time<"dynamic">})
// CHECK-SAME:    -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>)
// CHECK-NOT:     transpose
// CHECK:         %[[Y0:[0-9]+]] = torch.aten.matmul %arg3, %arg0 {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %[[Y1:[0-9]+]] = torch.aten.matmul %arg3, %arg0 {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %int1 = torch.constant.int 1
// CHECK-NEXT:    %[[SUM:[0-9]+]] = torch.aten.add.Tensor %[[Y0]], %[[Y1]], %int1 {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %[[Y2:[0-9]+]] = torch.aten.matmul %arg3, %arg2 {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    return %[[SUM]], %[[Y2]], %arg1 :
// CHECK-NOT:   bt.lift

// With no adapter-time argument there is no @adapter stage.
// NOADAPTER-NOT:   func.func @adapter
// NOADAPTER-LABEL: func.func @static
// NOADAPTER-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.name = "static.0"}, !torch.vtensor<[8,4],f32> {bt.name = "static.1"})
// NOADAPTER-NOT:   func.func @adapter
// NOADAPTER-LABEL: func.func @forward
// NOADAPTER-SAME:    %arg0: !torch.vtensor<[8,4],f32> {bt.name = "static.0", bt.time = #bt.time<"static">}
// NOADAPTER-SAME:    %arg1: !torch.vtensor<[8,4],f32> {bt.name = "static.1", bt.time = #bt.time<"static">}
// NOADAPTER-SAME:    %arg2: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}
// NOADAPTER-SAME:    %arg3: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}
// NOADAPTER-NOT:   func.func @adapter
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta"}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x"}, %arg3: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.inactive.weight"}, %arg4: !torch.vtensor<[?,8],f32> {bt.name = "unused_input"}) -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.transpose.int %arg1, %int0, %int1 : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %2 = torch.aten.add.Tensor %0, %1, %int1 : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.int -> !torch.vtensor<[8,4],f32>
  %3 = torch.aten.matmul %arg2, %0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.matmul %arg2, %0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %5 = torch.aten.add.Tensor %3, %4, %int1 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.int -> !torch.vtensor<[?,4],f32>
  %6 = torch.aten.matmul %arg2, %2 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %5, %6, %arg0 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>
}
